"""The pure logic behind the pages: time ranges, URL state, grid paging, headline figures, job flags, metric charts."""

from __future__ import annotations

import dataclasses
import json
from typing import Any
from urllib.parse import parse_qs, urlsplit

import plotly.io as pio
import pytest

from gpulens.alerts.state import AlertState
from gpulens.dashboard import ids
from gpulens.dashboard.alertdata import counts_as_firing
from gpulens.dashboard.components import ViewState, href
from gpulens.dashboard.figures.grids import GridCell
from gpulens.dashboard.flags import alert_jobs, job_flags, job_periods
from gpulens.dashboard.grid import grid_cells, named_page, natural_key, nodes_on_page, parse_page, select_page
from gpulens.dashboard.heatmaps import METRICS
from gpulens.dashboard.pages.overview import next_page
from gpulens.dashboard.panels import GpuSeries, gpu_charts
from gpulens.dashboard.summary import IDLE_BELOW, headline
from gpulens.dashboard.timerange import UNKNOWN_HISTORY_S, RangeError, resolve_range
from gpulens.model import GpuJob
from gpulens.storage.records import NodeTotals
from tests.dashboard.test_figures import GIB, T0, reading

UTIL = METRICS["utilization"]


# --- time range and URL state ---------------------------------------------------------------------------------------


def test_presets_end_now() -> None:
    span = resolve_range("6h", None, None, T0)
    assert (span.start, span.end, span.label) == (T0 - 6 * 3600, T0, "last 6h")
    assert resolve_range("bogus", None, None, T0).seconds == 3600  # unknown: the default


def test_custom_range_in_utc_with_an_open_end() -> None:
    span = resolve_range("custom", "2026-01-01T00:20", "", T0 + 3600)
    assert span.start == T0 + 1200
    assert span.end == T0 + 3600
    assert span.label == "2026-01-01 00:20 UTC to 2026-01-01 01:00 UTC"


def test_a_custom_range_is_clamped_to_the_stored_history() -> None:
    span = resolve_range("custom", "0001-01-01T00:00", "9999-12-31T23:59", T0, history_start=T0 - 7200)
    assert (span.start, span.end) == (T0 - 7200, T0)
    unknown = resolve_range("custom", "0001-01-01T00:00", "9999-12-31T23:59", T0)
    assert unknown.end == T0
    assert unknown.start == T0 - UNKNOWN_HISTORY_S
    with pytest.raises(RangeError, match="before the stored history begins"):
        resolve_range("custom", "2000-01-01T00:00", "2000-01-02T00:00", T0, history_start=T0 - 7200)
    with pytest.raises(RangeError, match="in the future"):
        resolve_range("custom", "9000-01-01T00:00", "9999-01-01T00:00", T0)


@pytest.mark.parametrize(
    ("start", "end", "message"),
    [
        ("", "", "give a start"),
        ("yesterday", "", "is not a time"),
        ("2026-01-01T01:00", "2026-01-01T00:00", "not after"),
    ],
)
def test_bad_custom_ranges_say_why(start: str, end: str, message: str) -> None:
    with pytest.raises(RangeError, match=message):
        resolve_range("custom", start, end, T0)


def test_view_state_reads_the_url_and_drops_what_it_does_not_know() -> None:
    state = ViewState.from_query({"range": "24h", "refresh": "1m", "from": "x" * 100})
    assert (state.range, state.refresh) == ("24h", "1m")
    assert len(state.start) == 40
    assert ViewState.from_query({"range": "2y", "refresh": "1s"}) == ViewState()


def test_links_keep_the_range() -> None:
    state = ViewState(range="custom", start="2026-01-01T00:00", end="2026-01-01T01:00", refresh="off")
    url = urlsplit(href("/jobs/a%2Fb", state, page=2))
    assert url.path == "/jobs/a%2Fb"
    assert parse_qs(url.query) == {
        "range": ["custom"],
        "from": ["2026-01-01T00:00"],
        "to": ["2026-01-01T01:00"],
        "refresh": ["off"],
        "page": ["2"],
    }
    assert href("/", ViewState()) == "/?range=1h"


# --- grids at any cluster size --------------------------------------------------------------------------------------


def many_cells(nodes: int, gpus: int = 8) -> list[GridCell]:
    return [
        GridCell(reading(f"node-{n}", g, utilization_ratio=(n % 10) / 10)) for n in range(nodes) for g in range(gpus)
    ]


def test_natural_order() -> None:
    assert sorted(["node-10", "node-2", "node-1a", "node-1"], key=natural_key) == [
        "node-1",
        "node-1a",
        "node-2",
        "node-10",
    ]


def test_pages_hold_a_fixed_number_of_nodes() -> None:
    grid = select_page(many_cells(1000), UTIL, page=31, per_page=32)
    assert grid.pages == 32
    assert grid.page == 31
    assert grid.nodes == [f"node-{n}" for n in range(992, 1000)]
    assert len(grid.cells) == 8 * 8
    assert grid.page_of("node-40") == 1
    assert select_page(many_cells(10), UTIL, page=99).page == 0  # clamped


def test_a_named_page_needs_the_cells_of_its_own_nodes_only() -> None:
    """The jobs page reads the readings of one page's nodes: the same page as select_page over every cell."""
    cells = many_cells(100)
    names = [c.reading.node for c in cells]
    for page in (0, 1, 3, 99):
        shown = set(nodes_on_page(names, page, per_page=32))
        assert len(shown) == (4 if page >= 3 else 32)
        partial = named_page([c for c in cells if c.reading.node in shown], names, UTIL, page=page, per_page=32)
        whole = select_page(cells, UTIL, page=page, per_page=32)
        assert (partial.nodes, partial.cells, partial.page, partial.pages) == (
            whole.nodes,
            whole.cells,
            whole.page,
            whole.pages,
        )
        assert len(partial.rows) == 100
    assert nodes_on_page([], 5) == []
    assert named_page([], [], UTIL).pages == 1


def test_filter_and_sorts() -> None:
    cells = many_cells(30)
    assert select_page(cells, UTIL, text="NODE-2").nodes[:3] == ["node-2", "node-20", "node-21"]
    by_value = select_page(cells, UTIL, sort="value").nodes
    assert by_value[:3] == ["node-9", "node-19", "node-29"]  # 90% utilization first
    cells.append(GridCell(reading("node-5", 8, up=False)))
    assert select_page(cells, UTIL, sort="problems").nodes[0] == "node-5"


def test_grid_cells_join_jobs_and_mark_stale_readings() -> None:
    fresh = reading("node-0", 0)
    old = dataclasses.replace(reading("node-0", 1), timestamp=T0 - 600)
    job = GpuJob("node-0", 0, fresh.uuid, "train", "alice")
    cells = grid_cells([fresh, old], [job], now=T0 + 5, stale_after_s=120)
    assert [(c.jobs, c.stale) for c in cells] == [((job,), False), ((), True)]


def test_parse_page() -> None:
    assert [parse_page(v) for v in ("3", None, "x", "-2")] == [2, 0, 0, 0]


def test_pager_clicks() -> None:
    assert next_page(ids.OVERVIEW_NEXT, 3, 4, None) == 4
    assert next_page(ids.OVERVIEW_NEXT, 4, 4, None) == 4
    assert next_page(ids.OVERVIEW_PREV, 1, 4, None) == 1
    click = {"points": [{"x": 20, "y": 2}]}  # the map's 121st node, on the fourth page of 32
    assert next_page(ids.OVERVIEW_MAP, 1, 32, click) == 4
    assert next_page(ids.OVERVIEW_FILTER, 7, 32, None) == 1  # a new filter starts at the first page


# --- headline figures -----------------------------------------------------------------------------------------------


def test_headline_counts() -> None:
    job = GpuJob("node-0", 1, "GPU-node-0-1", "j", "u")
    cells = [
        GridCell(reading("node-0", 0, utilization_ratio=0.9, memory_used_bytes=10 * GIB, power_watts=500.0)),
        GridCell(reading("node-0", 1, utilization_ratio=IDLE_BELOW / 2, memory_used_bytes=0), (job,)),
        GridCell(reading("node-1", 0, up=False)),
        GridCell(reading("node-1", 1), stale=True),
    ]
    h = headline(cells)
    assert (h.gpus, h.up, h.down, h.stale, h.nodes) == (4, 2, 1, 1, 2)
    assert (h.busy, h.idle, h.allocated_idle) == (1, 1, 1)
    assert h.utilization_ratio_mean == pytest.approx((0.9 + IDLE_BELOW / 2) / 2)
    assert h.memory_used_bytes == 10 * GIB
    assert h.memory_total_bytes == 160 * GIB
    assert h.power_watts == 850.0
    assert h.summed_at is None


def test_headline_from_the_nodes_totals() -> None:
    """The store's totals give busy to power; the cells still give the GPUs, up, down and stale."""
    cells = [
        GridCell(reading("node-0", 0)),
        GridCell(reading("node-1", 0, up=False)),
        GridCell(reading("n", 1), stale=True),
    ]
    totals = [
        NodeTotals("node-0", T0 - 100, 1, 1, 0, 0, 0.5, 8.0, 16.0, 300.0, 700.0),
        NodeTotals("node-1", T0 - 90, 2, 0, 2, 1, 0.04, 2.0, 32.0, 200.0, 1400.0),
    ]
    h = headline(cells, totals)
    assert (h.gpus, h.up, h.down, h.stale, h.nodes) == (3, 1, 1, 1, 3)
    assert (h.busy, h.idle, h.allocated_idle) == (1, 2, 1)
    assert h.utilization_ratio_mean == pytest.approx(0.54 / 3)
    assert (h.memory_used_bytes, h.memory_total_bytes) == (10, 48)
    assert (h.power_watts, h.power_limit_watts) == (500.0, 2100.0)
    assert h.summed_at == T0 - 100  # the older node's time
    assert headline(cells, []).utilization_ratio_mean is None


# --- job flags from alerts ------------------------------------------------------------------------------------------


def alert(
    rule: str, state: str, labels: dict[str, str], fired: float | None, resolved: float | None = None
) -> AlertState:
    return AlertState(
        fingerprint=rule + str(sorted(labels.items())),
        rule=rule,
        labels={"alertname": rule, **labels},
        annotations={"summary": rule},
        state=state,
        active_since=(fired or T0) - 60,
        fired_at=fired,
        resolved_at=resolved,
    )


def test_flags_come_from_firing_job_alerts_only() -> None:
    alerts = [
        alert("CommunicationStall", "firing", {"job_id": "a"}, T0),
        alert("JobStraggler", "pending", {"job_id": "b"}, None),
        alert("GpuIdleAllocated", "firing", {"job_id": "c,d", "node": "n", "gpu": "0"}, T0),
        alert("GpuThermalThrottling", "firing", {"job_id": "a"}, T0),
    ]
    assert job_flags(alerts) == {"a": {"stalled"}, "c": {"idle"}, "d": {"idle"}}
    assert alert_jobs({"job_id": "c,d"}) == ["c", "d"]


def test_the_watchdog_is_never_counted_as_firing() -> None:
    alerts = [
        alert("Watchdog", "firing", {"severity": "none"}, T0),
        alert("GpuThermalThrottling", "firing", {"severity": "warning", "node": "n", "gpu": "0"}, T0),
        alert("JobStraggler", "pending", {"severity": "warning", "job_id": "b"}, None),
    ]
    assert [a.rule for a in alerts if counts_as_firing(a)] == ["GpuThermalThrottling"]


def test_periods_mark_each_alert_until_it_resolved_or_now() -> None:
    episodes = [
        alert("CommunicationStall", "resolved", {"job_id": "a"}, T0, T0 + 300),
        alert("CommunicationStall", "firing", {"job_id": "a"}, T0 + 200),  # re-fired: overlaps, merged
        alert("JobStraggler", "firing", {"job_id": "a", "node": "node-02", "gpu": "2"}, T0 + 600),
        alert("CommunicationStall", "firing", {"job_id": "b"}, T0),
        alert("CommunicationStall", "pending", {"job_id": "a"}, None),
    ]
    periods = job_periods(episodes, "a", now=T0 + 900)
    assert [(p.start, p.end, p.kind, p.label) for p in periods] == [
        (T0 - 60, T0 + 900, "stall", "stall"),  # from when the condition began to hold, not when it fired
        (T0 + 540, T0 + 900, "straggler", "straggler node-02:2"),
    ]


# --- the node and GPU charts ----------------------------------------------------------------------------------------


def series(label: str, color: str, **values: list[float | None]) -> GpuSeries:
    return GpuSeries(label, color, [T0, T0 + 10, T0 + 20], values)


def figure_data(chart: Any) -> dict[str, Any]:
    return json.loads(pio.to_json(chart.figure))


def test_charts_draw_a_shared_limit_once_and_differing_limits_per_gpu() -> None:
    gpus = [
        series("GPU 0", "#111111", power_watts=[300.0, 310.0, 320.0], power_limit_watts=[700.0] * 3),
        series("GPU 1", "#222222", power_watts=[200.0, 210.0, 220.0], power_limit_watts=[700.0] * 3),
    ]
    charts = {c.key: figure_data(c) for c in gpu_charts(gpus, start=T0, end=T0 + 30)}
    power = charts["power"]["data"]
    assert [t["name"] for t in power] == ["GPU 0", "GPU 1", "limit"]
    assert power[2]["y"] == [700.0, 700.0]
    assert power[2]["line"]["dash"] == "dash"
    capped = [series("GPU 0", "#111111", power_watts=[300.0] * 3, power_limit_watts=[700.0, 350.0, 350.0]), gpus[1]]
    limits = [t for t in figure_data(gpu_charts(capped, start=T0, end=T0 + 30)[4])["data"] if "limit" in t["name"]]
    assert [t["name"] for t in limits] == ["GPU 0 limit", "GPU 1 limit"]


def test_charts_derive_link_ceilings_and_skip_quiet_error_counters() -> None:
    gpu = series(
        "GPU 0",
        "#111111",
        pcie_tx_bytes_per_second=[1e9, 2e9, 3e9],
        pcie_link_generation=[5.0] * 3,
        pcie_link_width=[16.0] * 3,
        nvlink_links_active=[18.0] * 3,
        nvlink_tx_bytes_per_second=[1e9] * 3,
        ecc_corrected_errors_total=[0.0, 0.0, 0.0],
        nvlink_crc_flit_errors_total=[0.0, 250.0, 250.0],
    )
    charts = {c.key: figure_data(c) for c in gpu_charts([gpu], start=T0, end=T0 + 30)}
    pcie_max = next(t for t in charts["pcie"]["data"] if t["name"] == "link max")
    assert pcie_max["y"][0] == pytest.approx(63.0e9, rel=1e-3)
    nvlink_max = next(t for t in charts["nvlink"]["data"] if t["name"] == "link max")
    assert nvlink_max["y"][0] == 450e9
    assert [t["name"] for t in charts["errors"]["data"]] == ["GPU 0 NVLink CRC"]


def test_charts_draw_the_ceiling_of_a_pcie_gen6_link() -> None:
    gpu = series(
        "GPU 0",
        "#111111",
        pcie_tx_bytes_per_second=[60e9] * 3,
        pcie_link_generation=[6.0] * 3,
        pcie_link_width=[16.0] * 3,
    )
    pcie = figure_data(next(c for c in gpu_charts([gpu], start=T0, end=T0 + 30) if c.key == "pcie"))["data"]
    pcie_max = next(t for t in pcie if t["name"] == "link max")
    assert pcie_max["y"] == [pytest.approx(121.0e9, rel=1e-3)] * 2


def test_charts_say_what_is_missing() -> None:
    charts = {c.key: figure_data(c) for c in gpu_charts([series("GPU 0", "#111111")], start=T0, end=T0 + 30)}
    assert charts["activity"]["layout"]["annotations"][0]["text"] == "no profiling data (DCGM sources only)"
    assert charts["errors"]["layout"]["annotations"][0]["text"] == "no errors in this range"
    assert charts["throttle"]["layout"]["annotations"][0]["text"] == "no throttling in this range"


def test_a_jobs_processes_read_together_show_no_pid() -> None:
    """Over Prometheus an exporter without --process-pids gives a job's processes on a GPU as one, pid 0: the table
    shows no pid for it, and the pid of a real process."""
    from gpulens.dashboard.components import processes_table
    from gpulens.dashboard.formatting import MISSING
    from gpulens.model import ProcessReading

    def texts(node: Any) -> list[str]:
        if isinstance(node, str):
            return [node]
        children = getattr(node, "children", None)
        items = children if isinstance(children, list) else [] if children is None else [children]
        return [t for child in items for t in texts(child)]

    together = ProcessReading("n1", 0, "GPU-0", 0, 5 * GIB, None, "alice", "42")
    one = ProcessReading("n1", 1, "GPU-1", 4711, GIB, "python", "bob", "43")
    cells = texts(processes_table([together, one], ViewState()))
    assert "4711" in cells
    assert "0" not in cells
    assert cells.count(MISSING) == 2  # the pid and the command of the job's processes together
