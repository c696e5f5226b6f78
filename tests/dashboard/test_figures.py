"""The figure builders are pure: records in, Plotly figures out. These tests read the figures back as JSON data."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import plotly.io as pio
import pytest

from gpulens.dashboard.figures.gputime import Row, bin_values, gpu_time_heatmap
from gpulens.dashboard.figures.grids import GridCell, _run_starts, cluster_map, gpu_heatmap, job_grid
from gpulens.dashboard.figures.links import link_load, node_topology, pcie_degraded
from gpulens.dashboard.figures.periods import Period
from gpulens.dashboard.figures.style import DOWN_COLOR, PALETTE
from gpulens.dashboard.figures.throttle import MaskSeries, throttle_timeline
from gpulens.dashboard.figures.timeseries import GIB as GIB_AXIS
from gpulens.dashboard.figures.timeseries import PERCENT, RATE, Line, time_series
from gpulens.dashboard.heatmaps import METRICS
from gpulens.dashboard.pages.interconnect import LINK_FIELDS
from gpulens.hardware import nvlink_max_bytes_per_second, pcie_max_bytes_per_second
from gpulens.metriccatalogue import GPU_FIELDS
from gpulens.model import GpuJob, GpuReading
from gpulens.ratios import link_loads, memory_used_ratio_of, nvlink_utilization_ratio, pcie_utilization_ratio

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
GIB = 1024**3


def reading(node: str = "node-00", gpu: int = 0, **values: Any) -> GpuReading:
    defaults: dict[str, Any] = {
        "utilization_ratio": 0.5,
        "memory_used_bytes": 40 * GIB,
        "memory_total_bytes": 80 * GIB,
        "temperature_celsius": 60.0,
        "power_watts": 350.0,
        "power_limit_watts": 700.0,
        "pcie_link_generation": 5,
        "pcie_link_generation_max": 5,
        "pcie_link_width": 16,
        "pcie_link_width_max": 16,
        "pcie_tx_bytes_per_second": 6.3e9,
        "pcie_rx_bytes_per_second": 3.0e9,
        "nvlink_links_active": 18,
        "nvlink_tx_bytes_per_second": 45e9,
        "nvlink_rx_bytes_per_second": 90e9,
    }
    defaults.update(values)
    return GpuReading(
        node=node, gpu=gpu, uuid=f"GPU-{node}-{gpu}", model="NVIDIA H100 80GB HBM3", timestamp=T0, **defaults
    )


def as_data(figure: Any) -> dict[str, Any]:
    """The figure as the browser receives it."""
    return json.loads(pio.to_json(figure))


# --- link ceilings and ratios (the core's) ----------------------------------------------------------------------------


def test_link_ceilings() -> None:
    assert pcie_max_bytes_per_second(5, 16) == pytest.approx(63.0e9, rel=1e-3)
    assert pcie_max_bytes_per_second(3, 8) == pytest.approx(7.88e9)
    assert pcie_max_bytes_per_second(None, 16) is None
    assert nvlink_max_bytes_per_second(18) == 450e9
    assert nvlink_max_bytes_per_second(0) is None


def test_ratios_use_the_busier_direction_and_the_current_link() -> None:
    r = reading(pcie_link_generation=3, pcie_link_width=8, pcie_tx_bytes_per_second=7.0e9, pcie_rx_bytes_per_second=1e9)
    assert pcie_utilization_ratio(r) == pytest.approx(7.0e9 / 7.88e9)
    assert nvlink_utilization_ratio(reading()) == pytest.approx(90e9 / 450e9)
    assert nvlink_utilization_ratio(reading(nvlink_links_active=0)) is None
    assert memory_used_ratio_of(reading(memory_total_bytes=None)) is None
    assert pcie_degraded(r)
    assert not pcie_degraded(reading())


def test_a_pcie_gen6_link_shows_its_ratio() -> None:
    # Gen 6 x16 carries 16 x 7.563 GB/s = 121 GB/s per direction: 60.5 GB/s is half of it.
    r = reading(
        pcie_link_generation=6,
        pcie_link_generation_max=6,
        pcie_tx_bytes_per_second=60.5e9,
        pcie_rx_bytes_per_second=1e9,
    )
    cell = as_data(gpu_heatmap([GridCell(r)], ["node-00"], METRICS["pcie"]))["data"][0]
    assert cell["z"] == [[0.5]]
    assert cell["text"] == [["50%"]]
    assert "PCIe 50%" in cell["customdata"][0][0]
    markers = next(t for t in as_data(node_topology([r]))["data"] if t.get("customdata"))
    assert "Gen6 x16 (max Gen6 x16), load 50%" in markers["hovertext"][0]


# --- node x GPU grids -----------------------------------------------------------------------------------------------


def test_heatmap_places_each_gpu_and_links_to_it() -> None:
    cells = [GridCell(reading("node-00", i, utilization_ratio=i / 10)) for i in range(4)]
    cells.append(GridCell(reading("node-01", 0, utilization_ratio=1.0)))
    data = as_data(gpu_heatmap(cells, ["node-01", "node-00"], METRICS["utilization"]))
    values = data["data"][0]
    assert values["y"] == ["node-01", "node-00"]
    assert values["x"] == [0, 1, 2, 3]
    assert values["z"][0] == [1.0, None, None, None]  # node-01 has one GPU
    assert values["z"][1] == [0.0, 0.1, 0.2, 0.3]
    assert values["hovertext"][1][2] == "/gpus/GPU-node-00-2"  # a click carries hovertext, not customdata
    assert values["customdata"][1][2].startswith("<b>node-00:2</b>")
    assert values["text"][1][3] == "30%"
    assert len(data["data"]) == 1  # nothing down or stale: no overlay


def test_a_huge_gpu_index_adds_one_column_not_four_hundred_thousand() -> None:
    """One target claims GPU 400,000: the grid lays out the GPUs that exist (nine columns), not max(index) + 1."""
    cells = [GridCell(reading("node-00", i)) for i in range(8)]
    cells.append(GridCell(reading("node-01", 400_000)))
    for fig in (
        gpu_heatmap(cells, ["node-00", "node-01"], METRICS["utilization"]),
        job_grid(cells, ["node-00", "node-01"]),
    ):
        data = as_data(fig)
        trace = data["data"][0]
        assert trace["x"] == [*range(8), 400_000]
        assert all(len(row) == 9 for row in trace["z"])
        assert data["layout"]["xaxis"]["type"] == "category"
        assert len(pio.to_json(fig)) < 100_000  # 67 MB before, for a grid of 400,001 columns


def test_values_from_targets_and_jobs_are_escaped_in_hover_and_cell_text() -> None:
    """Node, model, job and user go into Plotly's pseudo-HTML as text, never as markup."""
    evil = "<img src=x onerror=alert(1)>"
    r = dataclasses.replace(reading(node=evil, gpu=0), model="<b>GPU</b>", uuid="GPU-<i>")
    cell = GridCell(r, (GpuJob(evil, 0, r.uuid, "<script>x</script>", "&bob"),))
    heat = as_data(gpu_heatmap([cell], [evil], METRICS["utilization"]))
    jobs = as_data(job_grid([cell], [evil]))
    shown = [heat["data"][0]["customdata"][0][0], jobs["data"][0]["customdata"][0][0], jobs["data"][0]["text"][0][0]]
    shown += heat["layout"]["yaxis"]["ticktext"]
    for text in shown:
        assert "<img" not in text
        assert "<script" not in text
        assert "<i>" not in text
    hover = heat["data"][0]["customdata"][0][0]
    assert "&lt;img src=x onerror=alert(1)&gt;:0" in hover
    assert "&lt;b&gt;GPU&lt;/b&gt;" in hover
    assert "&lt;script&gt;x&lt;/script&gt; (&amp;bob)" in hover
    assert hover.startswith("<b>")  # gpulens's own markup stays
    assert jobs["data"][0]["text"][0][0].startswith("&lt;script&gt;")


def test_heatmap_marks_down_and_stale_gpus_apart_from_values() -> None:
    cells = [
        GridCell(reading(gpu=0)),
        GridCell(reading(gpu=1, up=False, utilization_ratio=None)),
        GridCell(reading(gpu=2), stale=True),
    ]
    data = as_data(gpu_heatmap(cells, ["node-00"], METRICS["memory"]))
    values, overlay = data["data"]
    assert values["z"] == [[0.5, None, None]]  # a stale reading is not shown as if current
    assert overlay["z"] == [[None, 1.0, 0.0]]  # 1: down (red), 0: stale (grey)
    assert "GPU down" in overlay["customdata"][0][1]
    assert "no recent reading" in overlay["customdata"][0][2]
    # a click on a grey or red cell opens the GPU too; the overlay has no hover or link on the cells it leaves bare
    assert overlay["hovertext"] == [[None, *values["hovertext"][0][1:]]]
    assert overlay["customdata"][0][0] is None
    assert overlay["hoverongaps"] is False


def test_heatmap_hover_names_jobs_and_throttling() -> None:
    cell = GridCell(reading(throttle_reasons=0x20 | 0x1), (GpuJob("node-00", 0, "GPU-node-00-0", "train", "alice"),))
    hover = as_data(gpu_heatmap([cell], ["node-00"], METRICS["utilization"]))["data"][0]["customdata"]
    text = hover[0][0]
    assert "job train (alice)" in text
    assert "throttle: sw_thermal" in text  # the idle reason is not news
    assert "idle" not in text.split("throttle:")[1]


def test_every_metric_reads_a_full_reading() -> None:
    r = reading()
    assert {key: m.value(r) is not None for key, m in METRICS.items()} == dict.fromkeys(METRICS, True)


def test_job_grid_colours_jobs_apart_and_leaves_free_gpus_blank() -> None:
    def held(gpu: int, job: str) -> GridCell:
        return GridCell(reading(gpu=gpu), (GpuJob("node-00", gpu, f"GPU-node-00-{gpu}", job, "alice"),))

    cells = [held(0, "b-job"), held(1, "a-job"), held(2, "b-job"), GridCell(reading(gpu=3))]
    trace = as_data(job_grid(cells, ["node-00"]))["data"][0]
    assert trace["z"] == [[1.0, 0.0, 1.0, None]]  # colours by job id order: a-job first
    assert trace["hovertext"] == [["/jobs/b-job", "/jobs/a-job", "/jobs/b-job", "/gpus/GPU-node-00-3"]]
    assert trace["text"] == [["b-job", "a-job", "b-job", ""]]
    assert _run_starts(["a", "a", "b", "", "b", "b", "a"]) == ["a", "", "b", "", "b", "", "a"]


def test_cluster_map_wraps_nodes_into_rows() -> None:
    nodes = [(f"node-{i:03d}", i / 120, f"node {i}") for i in range(120)]
    trace = as_data(cluster_map(nodes, METRICS["utilization"], columns=50))["data"][0]
    assert [len(row) for row in trace["z"]] == [50, 50, 50]
    assert trace["z"][2][19] == pytest.approx(119 / 120, rel=1e-2)
    assert trace["z"][2][20] is None  # past the last node
    assert trace["customdata"][1][14] == "node 64"


def test_empty_inputs_give_a_figure_that_says_so() -> None:
    data = as_data(gpu_heatmap([], [], METRICS["utilization"]))
    assert data["layout"]["annotations"][0]["text"] == "no GPUs to show"
    assert data["data"] == []


# --- time series ----------------------------------------------------------------------------------------------------


def test_uneven_times_are_sent_each() -> None:
    data = as_data(
        time_series([Line("GPU 0", [T0, T0 + 10, T0 + 30], [0.1, 0.2, 0.3])], PERCENT, start=T0, end=T0 + 30)
    )
    assert data["data"][0]["x"] == [1_767_225_600_000, 1_767_225_610_000, 1_767_225_630_000]
    assert "x0" not in data["data"][0]


def test_time_series_sends_millisecond_times_rounded_values_and_marks_periods() -> None:
    line = Line("GPU 0", [T0, T0 + 10, T0 + 20], [0.123456, None, 0.5])
    empty = Line("GPU 1", [T0], [None])
    period = Period(T0 + 5, T0 + 15, "stall", "stall")
    data = as_data(time_series([line, empty], PERCENT, start=T0, end=T0 + 30, periods=[period]))
    assert len(data["data"]) == 1  # a line with no value at all is left out
    trace = data["data"][0]
    assert (trace["x0"], trace["dx"]) == (1_767_225_600_000, 10_000)  # evenly spaced: a start and a step
    assert "x" not in trace
    assert trace["y"] == [0.1235, None, 0.5]
    assert data["layout"]["xaxis"]["range"] == [1_767_225_600_000, 1_767_225_630_000]
    shape = data["layout"]["shapes"][0]
    assert (shape["x0"], shape["x1"]) == (1_767_225_605_000, 1_767_225_615_000)
    assert data["layout"]["annotations"][0]["text"] == "stall"


def test_time_series_scales_memory_to_gib() -> None:
    data = as_data(time_series([Line("m", [T0], [40 * GIB])], GIB_AXIS, start=T0, end=T0 + 1))
    assert data["data"][0]["y"] == [40.0]
    assert data["layout"]["yaxis"]["ticksuffix"] == " GiB"


def test_time_series_without_data_says_so() -> None:
    data = as_data(time_series([], RATE, start=T0, end=T0 + 1, empty="no NVLink"))
    assert data["layout"]["annotations"][0]["text"] == "no NVLink"


def test_throttle_timeline_has_a_row_per_reason_that_occurred() -> None:
    masks = MaskSeries("GPU 2", [T0, T0 + 10, T0 + 20], [0x0, 0x20, 0x20 | 0x4])
    data = as_data(throttle_timeline([masks], start=T0, end=T0 + 30))
    rows = {trace["name"]: trace["y"] for trace in data["data"]}
    assert rows == {
        "sw_power_cap": [None, None, "GPU 2 sw_power_cap"],
        "sw_thermal": [None, "GPU 2 sw_thermal", "GPU 2 sw_thermal"],
    }


def test_throttle_timeline_without_throttling_says_so() -> None:
    data = as_data(throttle_timeline([MaskSeries("GPU 0", [T0], [0])], start=T0, end=T0 + 1))
    assert data["layout"]["annotations"][0]["text"] == "no throttling in this range"


def test_bin_values_averages_each_span() -> None:
    times = [T0 + 1, T0 + 2, T0 + 11, T0 + 25]
    assert bin_values(times, [1.0, 3.0, None, 5.0], T0, T0 + 30, 3) == [2.0, None, 5.0]


def test_gpu_time_heatmap_rows_and_autoscale() -> None:
    rows = [
        Row("node-00:0", [T0 + 1, T0 + 11], [0.1, 0.2]),
        Row("node-00:1", [T0 + 1], [0.0]),
    ]
    metric = METRICS["nvlink"]
    fixed = as_data(gpu_time_heatmap(rows, metric, start=T0, end=T0 + 20, bins=2))["data"][0]
    assert fixed["y"] == ["node-00:0", "node-00:1"]
    assert fixed["z"] == [[0.1, 0.2], [0.0, None]]
    assert fixed["zmax"] == 1
    scaled = as_data(gpu_time_heatmap(rows, metric, start=T0, end=T0 + 20, bins=2, autoscale=True))["data"][0]
    assert scaled["zmax"] == pytest.approx(0.2)
    assert scaled["colorbar"]["ticktext"] == ["0%", "10%", "20%"]


# --- interconnect ---------------------------------------------------------------------------------------------------


def test_link_load_counts_every_gpu_and_names_the_busiest() -> None:
    readings = [
        reading(gpu=0),  # PCIe 6.3/63 = 10%, NVLink 90/450 = 20%
        reading(gpu=1, pcie_tx_bytes_per_second=62.0e9),  # PCIe saturated
        reading(node="node-03", gpu=0, nvlink_links_active=0, nvlink_tx_bytes_per_second=None),
        reading(gpu=2, up=False),
    ]
    data = as_data(link_load(link_loads(readings), top=1))
    density, points = data["data"]
    counts = {(r, c): n for r, row in enumerate(density["z"]) for c, n in enumerate(row) if n}
    # Rows are NVLink, columns PCIe, 5% each: 20% NVLink and just under 10% PCIe; the same PCIe without NVLink;
    # saturated PCIe. The GPU down is left out.
    assert counts == {(4, 1): 1, (0, 1): 1, (4, 19): 1}
    assert points["text"] == ["node-00:1"]  # the busiest only
    assert points["customdata"] == ["/gpus/GPU-node-00-1"]
    assert points["x"][0] == pytest.approx(0.984, abs=1e-3)


def test_link_load_reads_only_the_fields_the_interconnect_page_asks_for() -> None:
    """A store that returns only the fields asked for (Prometheus does) leaves the others unknown: the page's
    LINK_FIELDS must hold every field the chart reads, or every GPU sits at 0 % on such a store."""
    readings = [reading(gpu=0), reading(gpu=1, pcie_tx_bytes_per_second=62.0e9)]
    asked = set(LINK_FIELDS) | {"up"}
    narrowed = [
        dataclasses.replace(r, **{spec.field: None for spec in GPU_FIELDS if spec.field not in asked}) for r in readings
    ]
    assert as_data(link_load(link_loads(narrowed))) == as_data(link_load(link_loads(readings)))
    assert narrowed[0].power_watts is None  # the narrowing did narrow


def test_link_load_without_link_readings_says_so() -> None:
    bare = [reading(pcie_link_generation=None, nvlink_links_active=None)]
    assert as_data(link_load(link_loads(bare)))["layout"]["annotations"][0]["text"] == "no PCIe or NVLink readings"


def test_topology_marks_degraded_and_down_links() -> None:
    gpus = [
        reading(gpu=0),
        reading(gpu=1, pcie_link_generation=3, pcie_link_width=8),
        reading(gpu=2),
    ]
    data = as_data(node_topology(gpus, {"GPU-node-00-2": 2}))
    markers = next(t for t in data["data"] if t.get("customdata"))
    assert markers["marker"]["color"] == [PALETTE[0], DOWN_COLOR, DOWN_COLOR]
    assert "2 down" in markers["hovertext"][2]
    assert "Gen3 x8" in markers["text"][1]
    assert any(t.get("text") == ["NVSwitch"] for t in data["data"])


def test_topology_of_a_pcie_only_node_has_no_fabric() -> None:
    gpus = [reading(gpu=i, nvlink_links_active=0) for i in range(2)]
    data = as_data(node_topology(gpus))
    assert not any(t.get("text") == ["NVSwitch"] for t in data["data"])
    assert [t["mode"] for t in data["data"]] == ["markers+text"]
