"""The text format's limits: each counted when hit, the rest of the page kept, and a long label cheap.

A label value is scanned linearly: a multi-MB ``hpc_job`` label line costs memory in proportion to the page, never
the gigabytes the backtracking pattern took (measured with tracemalloc, bounding allocations, not time), in the
collector's and the exporter's readers alike.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

from gpulens.collector.scrape import Scraper, sanitize
from gpulens.collector.targets import Target
from gpulens.dcgmpage import parse_dcgm_metrics
from gpulens.exporter.dcgmsource import DcgmSource
from gpulens.model import GpuJob
from gpulens.promtext import LineStats, TextLimits, read_samples
from gpulens.storedrange import GPUS_PER_TARGET
from tests.fakes.dcgm_pages import GPU0, ID0, ID1
from tests.fakes.dcgm_server import stand_in_dcgm_exporter
from tests.fakes.static_source import node_snapshot

LABEL_BYTES = 2_000_000  # the backtracking pattern took 378 MB for this one label
LONG_PAGE = (
    f"DCGM_FI_DEV_GPU_UTIL{{{ID0}}} 55\n"
    f'DCGM_FI_DEV_GPU_TEMP{{{ID0},hpc_job="{"j" * LABEL_BYTES}"}} 40\n'
    f"DCGM_FI_DEV_GPU_TEMP{{{ID1}}} 41\n"
)


def peak_bytes(work: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_multi_megabyte_label_line_is_rejected_with_bounded_memory() -> None:
    parsed = parse_dcgm_metrics(LONG_PAGE, node="n", timestamp=0.0)
    assert parsed.problems == {"dcgm_line_too_long": 1}
    assert [g.temperature_celsius for g in parsed.gpus] == [None, 41.0]  # GPU 0 keeps its utilization line
    assert parsed.gpus[0].utilization_ratio == 0.55
    assert parsed.jobs == ()
    assert peak_bytes(lambda: parse_dcgm_metrics(LONG_PAGE, node="n", timestamp=0.0)) < 1_000_000


def test_the_exporter_reads_a_long_label_page_in_memory_bounded_by_the_page() -> None:
    body = LONG_PAGE.encode()
    source = DcgmSource("http://127.0.0.1:9400/metrics", node="n", fetch=lambda url, timeout: body)
    snapshot = source.read()
    assert snapshot.errors == {"dcgm_line_too_long": 1}
    assert peak_bytes(source.read) < len(body) + 1_000_000  # the decoded page, and little else


def test_the_collector_reads_a_long_label_page_in_memory_bounded_by_the_page() -> None:
    body = LONG_PAGE.encode()
    with stand_in_dcgm_exporter(body) as server:
        scraper = Scraper()
        target = Target(name="t", url=server.url, kind="dcgm")
        try:
            result = scraper.scrape(target)
            peak = peak_bytes(lambda: scraper.scrape(target))
        finally:
            scraper.close()
    assert result.health.up
    assert result.rejected == {"dcgm_line_too_long": 1}
    assert peak < 3 * len(body) + 1_000_000  # the body, its text, and little else


def read(text: str, limits: TextLimits) -> tuple[list[str], LineStats]:
    stats = LineStats()
    return [s.labels.get("k", s.name) for s in read_samples(text, stats, limits)], stats


def test_a_label_value_over_its_limit_rejects_its_line_alone() -> None:
    limits = TextLimits(label_value_length=8)
    names, stats = read('a{k="12345678"} 1\nb{k="123456789"} 1\nc 1\n', limits)
    assert names == ["12345678", "c"]
    assert stats.limits == {"label_value_too_long": 1}
    assert stats.bad_reasons == {}


def test_a_line_over_its_limit_is_skipped_unread() -> None:
    names, stats = read("a 1\n" + "b" * 100 + " 1\nc 1\n", TextLimits(line_length=50))
    assert names == ["a", "c"]
    assert stats.limits == {"line_too_long": 1}


def test_a_series_with_too_many_labels_is_rejected() -> None:
    many = ",".join(f'l{i}="v"' for i in range(65))
    names, stats = read(f"a{{{many}}} 1\nb 1\n", TextLimits())
    assert names == ["b"]
    assert stats.limits == {"too_many_labels": 1}


def test_series_past_the_page_limit_are_dropped_and_counted() -> None:
    names, stats = read("a 1\nb 1\nc 1\nd 1\na 2\n", TextLimits(series_per_page=2))
    assert names == ["a", "b"]
    assert stats.limits == {"series_limit": 2}


def test_a_page_naming_84331_gpus_for_one_node_is_capped() -> None:
    page = "".join(f'DCGM_FI_DEV_GPU_TEMP{{gpu="{i}",UUID="GPU-{i}"}} 40\n' for i in range(84_331))
    parsed = parse_dcgm_metrics(page, node="n", timestamp=0.0)
    assert len(parsed.gpus) == GPUS_PER_TARGET
    refused = parsed.problems["dcgm_gpu_limit"] + parsed.problems["dcgm_gpu_index_out_of_range"]
    assert refused == 84_331 - GPUS_PER_TARGET


def test_a_snapshot_with_more_gpus_than_a_target_may_report_is_capped() -> None:
    snapshot = node_snapshot("n", gpus=GPUS_PER_TARGET + 76, t=100.0)
    kept, rejected = sanitize(snapshot, now=100.0, future_tolerance_s=300.0)
    assert len(kept.gpus) == GPUS_PER_TARGET
    assert rejected == {"gpu_limit": 76}


def test_a_byte_order_mark_is_read_alike_by_the_collector_and_the_exporter() -> None:
    page = f"DCGM_FI_DEV_GPU_TEMP{{{ID0}}} 40\nDCGM_FI_DEV_GPU_UTIL{{{ID0}}} 55\n"
    with stand_in_dcgm_exporter(b"\xef\xbb\xbf" + page.encode()) as server:
        scraper = Scraper()
        try:
            collected = scraper.scrape(Target(name="t", url=server.url, kind="dcgm"))
        finally:
            scraper.close()
        exported = DcgmSource(server.url, node="n").read()
    assert collected.rejected == {}
    assert exported.errors == {}
    assert collected.snapshot is not None
    [mine] = collected.snapshot.gpus
    assert (mine.uuid, mine.temperature_celsius, mine.utilization_ratio) == (GPU0, 40.0, 0.55)
    assert [(g.temperature_celsius, g.utilization_ratio) for g in exported.gpus] == [(40.0, 0.55)]


def test_a_snapshot_job_id_longer_than_a_label_value_is_dropped_and_counted() -> None:
    base = node_snapshot("n", gpus=2, t=100.0)
    first, second = base.gpus
    jobs = (GpuJob("n", 0, first.uuid, "j" * 16_000_000), GpuJob("n", 1, second.uuid, "train-7"))
    kept, rejected = sanitize(base.replace(jobs=jobs), now=100.0, future_tolerance_s=300.0)
    assert [j.job_id for j in kept.jobs] == ["train-7"]
    assert rejected == {"job_id_too_long": 1}
    assert len(kept.gpus) == 2
