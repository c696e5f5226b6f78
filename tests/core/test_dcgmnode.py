"""The page converter (gpulens.dcgmnode): XID counters, vanished GPUs, unusable pages, node names."""

from __future__ import annotations

import pytest

from gpulens.dcgmnode import DcgmPageError, DcgmPageReader, choose_node, is_loopback
from tests.fakes.dcgm_pages import GPU0, GPU1, ID0, ID1

URL = "http://127.0.0.1:9400/metrics"


def page(*lines: str) -> str:
    return "".join(line + "\n" for line in lines)


def temps(gpu0: bool = True, gpu1: bool = True) -> list[str]:
    return [
        line
        for line, on in ((f"DCGM_FI_DEV_GPU_TEMP{{{ID0}}} 40", gpu0), (f"DCGM_FI_DEV_GPU_TEMP{{{ID1}}} 41", gpu1))
        if on
    ]


def xid_count(ident: str, code: int, count: int) -> str:
    return f'DCGM_EXP_XID_ERRORS_COUNT{{{ident},window_size_in_ms="300000",xid="{code}"}} {count}'


def test_xid_window_counts_become_cumulative_counters_and_show_repeats() -> None:
    reader = DcgmPageReader(URL, node="n", fallback_node="f")
    history: list[dict[int, int]] = []
    for lines in (
        [f'DCGM_EXP_XID_ERRORS_COUNT{{{ID0},window_size_in_ms="300000"}} 0'],  # dcgm-exporter's "none"
        [xid_count(ID0, 43, 1)],
        [xid_count(ID0, 43, 2)],  # the same code again: visible (the last-XID gauge cannot show it)
        [xid_count(ID0, 43, 1)],  # one event left the window: nothing new
        [xid_count(ID0, 43, 2), xid_count(ID0, 79, 1)],
    ):
        result = reader.read(page(*temps(), *lines, f"DCGM_FI_DEV_XID_ERRORS{{{ID0}}} 43"), float(len(history)))
        history.append(dict(result.snapshot.gpus[0].xid_errors))
    assert history == [{}, {43: 1}, {43: 2}, {43: 2}, {43: 3, 79: 1}]


def test_err_code_label_is_accepted_as_the_code() -> None:
    reader = DcgmPageReader(URL, node="n", fallback_node="f")
    text = page(*temps(), f'DCGM_EXP_XID_ERRORS_COUNT{{{ID1},err_code="31"}} 2')
    assert reader.read(text, 0.0).snapshot.gpus[1].xid_errors == {31: 2}


def test_last_xid_change_counts_one_event() -> None:
    reader = DcgmPageReader(URL, node="n", fallback_node="f")
    counts = [
        dict(reader.read(page(*temps(), f"DCGM_FI_DEV_XID_ERRORS{{{ID0}}} {code}"), 0.0).snapshot.gpus[0].xid_errors)
        for code in (0, 43, 43, 0, 43)
    ]
    assert counts == [{}, {43: 1}, {43: 1}, {43: 1}, {43: 2}]


def test_a_vanished_gpu_is_reported_down_until_it_returns_or_is_forgotten() -> None:
    reader = DcgmPageReader(URL, node="n", fallback_node="f")
    reader.read(page(*temps(), f"DCGM_FI_DEV_XID_ERRORS{{{ID1}}} 79"), 0.0)
    gone = reader.read(page(*temps(gpu1=False)), 1.0)
    assert [(g.uuid, g.up) for g in gone.snapshot.gpus] == [(GPU0, True), (GPU1, False)]
    down = gone.snapshot.gpus[1]
    assert (down.gpu, down.model, down.node, down.timestamp, down.temperature_celsius) == (
        1,
        "NVIDIA H100 80GB HBM3",
        "n",
        1.0,
        None,
    )
    assert down.xid_errors == {79: 1}
    assert gone.problems == {"dcgm_gpu_missing": 1}
    still = reader.read(page(*temps(gpu1=False)), 2.0)
    assert still.problems == {}  # counted once per disappearance
    assert not still.snapshot.gpus[1].up
    assert reader.missing == [GPU1]
    back = reader.read(page(*temps()), 3.0)
    assert all(g.up for g in back.snapshot.gpus)
    reader.read(page(*temps(gpu1=False)), 4.0)
    assert reader.forget(GPU1)
    assert [g.uuid for g in reader.read(page(*temps(gpu1=False)), 5.0).snapshot.gpus] == [GPU0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", r"no GPU series on the page \(0 samples\)"),
        ("# HELP foo_bar x\n# TYPE foo_bar gauge\nfoo_bar 1\ngo_goroutines 7\n", r"\(2 samples, e.g. 'foo_bar'\)"),
    ],
)
def test_unusable_pages_raise_with_the_reason(text: str, message: str) -> None:
    reader = DcgmPageReader(URL, node="n", fallback_node="f")
    reader.read(page(*temps()), 0.0)
    with pytest.raises(DcgmPageError, match=message):
        reader.read(text, 1.0)


def test_an_unusable_page_does_not_report_the_gpus_lost() -> None:
    reader = DcgmPageReader(URL, node="n", fallback_node="f")
    reader.read(page(*temps()), 0.0)
    with pytest.raises(DcgmPageError):
        reader.read("", 1.0)
    assert reader.missing == []


@pytest.mark.parametrize("cut", [1, 8])
def test_a_last_line_without_its_line_feed_is_not_used_and_counted(cut: int) -> None:
    reader = DcgmPageReader(URL, node="n", fallback_node="f")
    read = reader.read(page(*temps())[:-cut], 0.0)  # the last line complete but for its line feed, or cut mid-value
    assert [g.temperature_celsius for g in read.snapshot.gpus] == [40.0]
    assert read.problems == {"dcgm_truncated": 1}


@pytest.mark.parametrize(
    ("configured", "url", "label", "expected"),
    [
        ("cfg", "http://10.0.0.5:9400/metrics", "page", "cfg"),
        (None, "http://gpu-node-12:9400/metrics", "page", "gpu-node-12"),
        (None, "http://localhost:9400/metrics", "gpu-node-13", "gpu-node-13"),
        (None, "http://127.0.0.1:9400/metrics", "localhost", "fallback"),
        (None, "http://[::1]:9400/metrics", None, "fallback"),
    ],
)
def test_node_name_prefers_configuration_then_url_host_then_page(
    configured: str | None, url: str, label: str | None, expected: str
) -> None:
    assert choose_node(configured, url, label, "fallback") == expected


def test_loopback_names() -> None:
    assert all(is_loopback(h) for h in ("localhost", "127.0.0.1", "127.1.2.3", "::1", "[::1]", "0.0.0.0", None))
    assert not any(is_loopback(h) for h in ("gpu-node-07", "10.0.0.5", "fe80::1"))
