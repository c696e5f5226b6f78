"""What an operator paged by a hang saw, mended (pure parts): hung GPUs marked hung, link colours that say state,
link scales that separate 25 % from 0 %, flags over the whole range, alert rows that open onto their runbook."""

from __future__ import annotations

from dataclasses import replace

import plotly.colors

from gpulens.alerts.catalogue import DEFINITIONS
from gpulens.alerts.state import AlertState, fingerprint
from gpulens.dashboard.alertdetail import alert_detail, when_text
from gpulens.dashboard.figures.gputime import Row, fitted_bins, gpu_time_heatmap
from gpulens.dashboard.figures.grids import gpu_heatmap
from gpulens.dashboard.figures.links import node_topology
from gpulens.dashboard.figures.style import HUNG_COLOR, LINK_COLORS
from gpulens.dashboard.figures.timeseries import PERCENT, Line, time_series
from gpulens.dashboard.flags import range_flags
from gpulens.dashboard.grid import grid_cells
from gpulens.dashboard.heatmaps import METRICS
from gpulens.model import GpuJob
from tests.dashboard.test_fabric import cluster, nic
from tests.dashboard.test_figures import T0, as_data, reading
from tests.dashboard.test_pages import text_of


def alert(rule: str, state: str = "firing", *, since: float = T0, **labels: str) -> AlertState:
    full = {"alertname": rule, "severity": "critical", **labels}
    return AlertState(
        fingerprint(full),
        rule,
        full,
        {"summary": f"{rule} summary", "description": f"{rule} description"},
        state,
        since,
        fired_at=since + 30 if state != "pending" else None,
    )


def job(job_id: str, node: str, gpu: int) -> GpuJob:
    return GpuJob(node=node, gpu=gpu, uuid=f"GPU-{node}-{gpu}", job_id=job_id, user="alice")


def test_a_stalled_jobs_gpus_are_hung_not_busy_in_the_heatmap() -> None:
    readings = [reading("node-00", i, utilization_ratio=1.0) for i in range(4)] + [reading("node-01", 0)]
    jobs = [job("llm", "node-00", i) for i in range(2)]
    stall = alert("CommunicationStall", job_id="llm", signature="rank_dead")
    driver = alert("GpuDriverHung", node="node-01")
    cells = grid_cells(readings, jobs, now=T0, stale_after_s=60, alerts=[stall, driver])
    hung = {(c.reading.node, c.reading.gpu): c.hung for c in cells}
    assert "job llm stalled (CommunicationStall, rank_dead)" in hung[("node-00", 0)]
    assert hung[("node-00", 2)] == ""  # busy, held by no stalled job: busy
    assert "driver" in hung[("node-01", 0)]
    figure = as_data(gpu_heatmap(cells, ["node-00", "node-01"], METRICS["utilization"]))
    _values, overlay = figure["data"]
    assert overlay["z"][0][:3] == [0.5, 0.5, None]  # hung, hung, not marked (its 100 % shows)
    assert overlay["text"][0][0] == "hung"
    stops = dict((round(v, 3), c) for v, c in overlay["colorscale"])
    assert HUNG_COLOR in stops.values()
    quiet = grid_cells(readings, jobs, now=T0, stale_after_s=60, alerts=[replace(stall, state="resolved")])
    assert not any(c.hung for c in quiet)


def test_the_link_scales_separate_a_quarter_from_nothing() -> None:
    """0 % and 25 % of a link differ by at least 15 % of luminance on the PCIe and NVLink heatmaps (the pale
    ``Purp`` scale differed by 13 %, ``Tealgrn`` by 10 %)."""

    def luminance(color: str) -> float:
        r, g, b = (float(x) for x in color[color.index("(") + 1 : -1].split(",")[:3])
        return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255

    for key in ("nvlink", "pcie"):
        scale = plotly.colors.get_colorscale(METRICS[key].colorscale)
        none, quarter = plotly.colors.sample_colorscale(scale, [0.0, 0.25])
        assert abs(luminance(quarter) - luminance(none)) >= 0.15, key


def test_a_dead_fabric_does_not_look_healthy() -> None:
    """Every port up at 0 %: pale idle, not green; down: red; fewer lanes than its peers: amber; traffic: green."""
    gpus = [reading("node-01", i, nvlink_tx_bytes_per_second=0.0, nvlink_rx_bytes_per_second=0.0) for i in range(8)]
    idle = [nic("node-01", f"mlx5_{i}", transmit_bytes_per_second=0.0, receive_bytes_per_second=0.0) for i in range(3)]
    figure = as_data(node_topology(gpus, {}, idle))
    (ports,) = [t for t in figure["data"] if t.get("name") == "NICs"]
    assert ports["marker"]["color"] == [LINK_COLORS["idle"]] * 3
    edges = [t["line"]["color"] for t in figure["data"] if t.get("mode") == "lines" and t["line"].get("width", 0) > 2]
    assert edges
    assert set(edges) == {LINK_COLORS["idle"]}
    mixed = as_data(node_topology([reading("node-01", i) for i in range(8)], {}, [n for n in cluster()]))
    (ports,) = [t for t in mixed["data"] if t.get("name") == "NICs"]
    by_device = dict(zip([t.split("<br>")[0] for t in ports["text"]], ports["marker"]["color"], strict=True))
    assert by_device["<b>mlx5_0</b>"] == LINK_COLORS["healthy"]
    assert by_device["<b>mlx5_1</b>"] == LINK_COLORS["down"]
    assert by_device["<b>mlx5_2</b>"] == LINK_COLORS["degraded"]
    assert len({LINK_COLORS[s] for s in ("healthy", "idle", "degraded", "down")}) == 4


def test_flags_cover_the_range_and_say_which_ended() -> None:
    active = [alert("JobStraggler", job_id="b")]
    ended = replace(alert("CommunicationStall", job_id="a"), state="resolved", resolved_at=T0 + 600)
    never_fired = alert("CommunicationStall", "pending", job_id="c")
    flags = range_flags(active, [ended, never_fired, active[0]])
    assert flags == {"a": {"stalled": False}, "b": {"straggling": True}}


def test_an_alert_row_opens_onto_its_description_and_the_catalogues_runbook() -> None:
    stall = replace(alert("CommunicationStall", job_id="a"), began_at=T0 - 40)
    text = text_of(alert_detail(stall))
    catalogue = next(d.rule for d in DEFINITIONS if d.rule.name == "CommunicationStall")
    assert "CommunicationStall description" in text
    assert catalogue.action[:60] in text  # the runbook, from the catalogue where the alert carries none
    assert catalogue.meaning[:60] in text
    assert when_text(stall) == "began 2025-12-31 23:59 UTC · fired 2026-01-01 00:00 UTC"


def test_short_range_heatmap_cells_span_their_samples_without_gaps() -> None:
    """Samples every 10 s over 15 minutes in 120 columns of 7.5 s left every fourth column empty (white stripes);
    the columns are now as wide as a sample step at least, and every column between the first sample and the last
    holds a value."""
    times = [T0 + 10 * i for i in range(90)]
    rows = [Row(f"GPU {g}", times, [0.9] * len(times)) for g in range(2)]
    figure = as_data(gpu_time_heatmap(rows, METRICS["utilization"], start=T0, end=T0 + 900, bins=120))
    (trace,) = figure["data"]
    assert len(trace["x"]) == 90
    assert all(v is not None for row in trace["z"] for v in row)
    assert fitted_bins(rows, T0, T0 + 7 * 24 * 3600, 120) == 120  # a long range keeps its columns


def test_a_chart_spans_the_data_it_has_and_identical_lines_are_named_together() -> None:
    """Ten minutes of data on a 1 h range fill the chart (the axis starts at the first sample, not an hour back);
    two GPUs with the same readings draw one line named after both, with a note, and a third stays its own."""
    times = [T0 + 3000 + 10 * i for i in range(60)]
    same = [0.5] * 60
    lines = [
        Line("GPU 0", times, same),
        Line("GPU 1", times, same, color="#f28e2b"),
        Line("GPU 2", times, [0.7] * 60),
        Line("GPU 0 limit", times, [1.0] * 60, dash="dash"),
        Line("GPU 1 limit", times, [1.0] * 60, dash="dash"),
    ]
    figure = as_data(time_series(lines, PERCENT, start=T0, end=T0 + 3600))
    assert figure["layout"]["xaxis"]["range"] == [round((T0 + 3000) * 1000), round((T0 + 3600) * 1000)]
    names = [t["name"] for t in figure["data"]]
    assert names == ["GPU 0 = GPU 1", "GPU 2", "GPU 0 limit = GPU 1 limit"]
    notes = [a["text"] for a in figure["layout"]["annotations"]]
    assert notes == ["read the same, drawn as one line: GPU 0, GPU 1"]  # limits coincide by design: no note
    whole = as_data(
        time_series([Line("GPU 0", [T0 + 10 * i for i in range(360)], [0.5] * 360)], PERCENT, start=T0, end=T0 + 3600)
    )
    assert whole["layout"]["xaxis"]["range"][0] == round(T0 * 1000)
