"""Node x GPU grids: the heatmap of a metric (down and stale GPUs marked), the grid of which job holds which GPU,
and the cluster map of one cell per node. A click on a cell carries the page it opens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import plotly.graph_objects as go

from gpulens.dashboard.figures.style import (
    DOWN_COLOR,
    HEALTH_COLORS,
    HUNG_COLOR,
    PALETTE,
    STALE_COLOR,
    VALIDATE,
    base_layout,
    colorscale,
    empty_figure,
    figure,
)
from gpulens.dashboard.formatting import celsius_text, gpu_label, percent_text, plotly_text, round_sig, watts_text
from gpulens.dashboard.heatmaps import Metric
from gpulens.dashboard.paths import gpu_path, job_path
from gpulens.model import GpuJob, GpuReading, throttle_reason_names
from gpulens.nodehealth import NodeHealth
from gpulens.ratios import memory_used_ratio_of, nvlink_utilization_ratio, pcie_utilization_ratio


@dataclass(frozen=True, slots=True)
class GridCell:
    """One GPU in a node x GPU grid."""

    reading: GpuReading
    jobs: tuple[GpuJob, ...] = ()
    stale: bool = False  # no reading for a while: its node's exporter or the collector is down
    hung: str = ""  # why the alert engine holds it hung (``dashboard.hung``): drawn as hung, whatever it reads


def gpu_hover(r: GpuReading, jobs: Sequence[GpuJob] = ()) -> str:
    """The hover text of one GPU: where it is, what runs on it and its main readings."""
    lines = [f"<b>{plotly_text(gpu_label(r.node, r.gpu))}</b> {plotly_text(r.model)}", plotly_text(r.uuid)]
    if jobs:
        lines.append("job " + ", ".join(plotly_text(f"{j.job_id} ({j.user or '?'})") for j in jobs))
    if not r.up:
        lines.append("<b>GPU down</b> (lost or unreadable)")
        return "<br>".join(lines)
    lines.append(f"util {percent_text(r.utilization_ratio)} · mem {percent_text(memory_used_ratio_of(r))}")
    lines.append(
        f"{celsius_text(r.temperature_celsius)} · {watts_text(r.power_watts)} of {watts_text(r.power_limit_watts)}"
    )
    pcie, nvlink = pcie_utilization_ratio(r), nvlink_utilization_ratio(r)
    lines.append(f"PCIe {percent_text(pcie)} · NVLink {'none' if r.nvlink_links_active == 0 else percent_text(nvlink)}")
    if r.throttle_reasons:
        reasons = [n for n in throttle_reason_names(r.throttle_reasons) if n != "idle"]
        if reasons:
            lines.append("throttle: " + ", ".join(reasons))
    return "<br>".join(lines)


def node_tick(node: str, health: str | None) -> str:
    """A row's label: the node, after a dot in its health's colour where its health is known."""
    if health not in HEALTH_COLORS:
        return plotly_text(node)
    return f'<span style="color:{HEALTH_COLORS[health]}">●</span> {plotly_text(node)}'


def _grid_axes(
    nodes: Sequence[str], columns: Sequence[int], height_per_row: int, health: Mapping[str, str] | None = None
) -> dict[str, Any]:
    return {
        "height": max(160, 70 + height_per_row * len(nodes)),
        "xaxis": {
            "title": {"text": "GPU"},
            "type": "category",
            "tickmode": "array",
            "tickvals": list(columns),
            "side": "top",
            "showgrid": False,
            "fixedrange": True,
        },
        "yaxis": {
            "autorange": "reversed",
            "showgrid": False,
            "fixedrange": True,
            "automargin": True,
            "tickmode": "array",
            "tickvals": list(nodes),
            "ticktext": [node_tick(node, (health or {}).get(node)) for node in nodes],
        },
        "margin": {"l": 8, "r": 8, "t": 40, "b": 8},
    }


@dataclass(frozen=True, slots=True)
class _Cell:
    """What one grid cell shows: its colour value, hover text, the page a click opens, and the text inside it."""

    z: float | None
    hover: str
    path: str
    text: str = ""
    overlay: float | None = None  # 1: down, 0.5: hung, 0: stale (drawn over the values in their own colours)


_EMPTY_CELL: Final = _Cell(None, "", "")


@dataclass(frozen=True, slots=True)
class _Matrix:
    """Rows of cells as the parallel 2-D lists a Plotly heatmap takes.

    A click's point keeps ``hovertext`` (the path) but not ``customdata`` (Dash drops array fields from heatmap
    points), so the path travels as hovertext and the hover text as customdata.
    """

    z: list[list[float | None]]
    hover: list[list[str]]
    path: list[list[str]]
    text: list[list[str]]
    overlay: list[list[float | None]]


def _matrix(
    cells: Sequence[GridCell], nodes: Sequence[str], describe: Callable[[GridCell], _Cell]
) -> tuple[list[int], _Matrix]:
    """One column per GPU index that exists among the nodes shown (not ``max(index) + 1``: one GPU numbered 400,000
    must not make every row 400,001 cells wide)."""
    by_key = {(c.reading.node, c.reading.gpu): c for c in cells}
    shown = set(nodes)
    columns = sorted({c.reading.gpu for c in cells if c.reading.node in shown})
    rows = [
        [describe(cell) if (cell := by_key.get((node, i))) is not None else _EMPTY_CELL for i in columns]
        for node in nodes
    ]
    return columns, _Matrix(
        z=[[c.z for c in row] for row in rows],
        hover=[[c.hover for c in row] for row in rows],
        path=[[c.path for c in row] for row in rows],
        text=[[c.text for c in row] for row in rows],
        overlay=[[c.overlay for c in row] for row in rows],
    )


def _covered(cells: Sequence[Sequence[str]], z: Sequence[Sequence[float | None]]) -> list[list[str | None]]:
    """``cells`` where ``z`` has a value, None on its gaps: an overlay trace carries hover text and links only for
    the cells it draws (the trace under it has the rest), not a second copy of every cell's."""
    return [
        [c if v is not None else None for c, v in zip(row, zrow, strict=True)]
        for row, zrow in zip(cells, z, strict=True)
    ]


def _cell_trace(
    m: _Matrix, nodes: Sequence[str], columns: Sequence[int], *, overlay: bool = False, **style: Any
) -> go.Heatmap:
    """One heatmap of the grid's cells; an ``overlay`` one (drawn over another) hovers and links only where it has a
    value."""
    if isinstance(style.get("colorscale"), str):  # unvalidated traces get the stops, not the name
        style["colorscale"] = colorscale(style["colorscale"])
    if overlay:
        style.update(hoverongaps=False)
    return go.Heatmap(
        x=list(columns),
        y=list(nodes),
        customdata=_covered(m.hover, style["z"]) if overlay else m.hover,
        hovertext=_covered(m.path, style["z"]) if overlay else m.path,
        hovertemplate="%{customdata}<extra></extra>",
        xgap=2,
        ygap=2,
        **style,
        **VALIDATE,
    )


def _run_starts(texts: Sequence[str]) -> list[str]:
    """Each text where a run of equal texts starts, ``""`` where it goes on: ``a a b b a`` is ``a - b - a``."""
    return [t if i == 0 or texts[i - 1] != t else "" for i, t in enumerate(texts)]


def gpu_heatmap(
    cells: Sequence[GridCell],
    nodes: Sequence[str],
    metric: Metric,
    *,
    show_text: bool = True,
    health: Mapping[str, NodeHealth] | None = None,
) -> go.Figure:
    """Nodes (rows, in the given order) x GPUs (columns) coloured by ``metric``; click a cell for its GPU page.

    Each row's label has a dot in its node's ``health`` colour (Healthy, Degraded, Unhealthy) where known, and each
    cell's hover says it with its reasons. Down GPUs are red, stale ones (no recent reading) grey, hung ones (a
    stalled job's, a hung driver's) orange and written "hung" whatever utilization they read, each with its own
    hover text.
    """
    if not cells:
        return empty_figure("no GPUs to show")

    def describe(cell: GridCell) -> _Cell:
        r = cell.reading
        value = metric.value(r) if r.up and not cell.stale else None
        hover = gpu_hover(r, cell.jobs)
        if cell.stale:
            hover += "<br><b>no recent reading</b> (exporter or collector down)"
        if cell.hung:
            hover += f"<br><b>{plotly_text(cell.hung)}</b>"
        judged = (health or {}).get(r.node)
        if judged is not None:
            reasons = "; ".join(f.text() for f in judged.findings[:3])
            hover += f"<br>node {judged.state}" + (f": {plotly_text(reasons)}" if reasons else "")
        overlay = 1.0 if not r.up else 0.0 if cell.stale else 0.5 if cell.hung else None
        text = "hung" if overlay == 0.5 else metric.text(value) if value is not None else ""
        return _Cell(round_sig(value, 3), hover, gpu_path(r.uuid), text, overlay)

    columns, m = _matrix(cells, nodes, describe)
    colorbar: dict[str, Any] = {"title": {"text": metric.label, "side": "right"}, "thickness": 12}
    if metric.ticks:
        colorbar.update(tickvals=[v for v, _ in metric.ticks], ticktext=[t for _, t in metric.ticks])
    traces = [
        _cell_trace(
            m,
            nodes,
            columns,
            z=m.z,
            zmin=metric.zmin,
            zmax=metric.zmax,
            colorscale=metric.colorscale,
            colorbar=colorbar,
            text=m.text if show_text else None,
            texttemplate="%{text}" if show_text else None,
            textfont={"size": 10},
            name=metric.label,
        )
    ]
    if any(v is not None for row in m.overlay for v in row):
        traces.append(
            _cell_trace(
                m,
                nodes,
                columns,
                overlay=True,
                z=m.overlay,
                zmin=0,
                zmax=1,
                colorscale=[
                    [0, STALE_COLOR],
                    [1 / 3, STALE_COLOR],
                    [1 / 3, HUNG_COLOR],
                    [2 / 3, HUNG_COLOR],
                    [2 / 3, DOWN_COLOR],
                    [1, DOWN_COLOR],
                ],
                showscale=False,
                text=[
                    [t if o == 0.5 else "" for t, o in zip(tr, orow, strict=True)]
                    for tr, orow in zip(m.text, m.overlay, strict=True)
                ]
                if show_text
                else None,
                texttemplate="<b>%{text}</b>" if show_text else None,
                textfont={"size": 10, "color": "#ffffff"},
                name="down, hung or stale",
            )
        )
    states = {node: h.state for node, h in (health or {}).items()}
    return figure(traces, base_layout(**_grid_axes(nodes, columns, 22, states)))


def job_grid(cells: Sequence[GridCell], nodes: Sequence[str], *, show_text: bool = True) -> go.Figure:
    """Which job holds which GPU: nodes x GPUs coloured by job (free GPUs blank); click a cell for its job.

    The jobs in the grid take the palette's colours in the order of their ids, so neighbours differ while there are
    fewer jobs than colours, and a refresh keeps each job's colour. A job's name is written once per run of its cells
    in a row (``_run_starts``), not in each: eight labels a node less to draw (the grid of 32 nodes drew in 0.23-0.28
    s instead of 0.35-0.46 s in Chromium), and a row reads as its jobs.
    """
    if not cells:
        return empty_figure("no GPUs to show")
    slot = {job: i % len(PALETTE) for i, job in enumerate(sorted({c.jobs[0].job_id for c in cells if c.jobs}))}

    def describe(cell: GridCell) -> _Cell:
        r = cell.reading
        hover = gpu_hover(r, cell.jobs)
        if not cell.jobs:
            return _Cell(None, hover + "<br>free", gpu_path(r.uuid))
        job = cell.jobs[0].job_id
        short = job if len(job) <= 12 else job[:11] + "\u2026"
        return _Cell(float(slot[job]), hover, job_path(job), plotly_text(short))

    columns, m = _matrix(cells, nodes, describe)
    labels = [_run_starts(row) for row in m.text]
    n = len(PALETTE)
    scale: list[list[float | str]] = []
    for i, color in enumerate(PALETTE):
        scale += [[i / n, color], [(i + 1) / n, color]]
    trace = _cell_trace(
        m,
        nodes,
        columns,
        z=m.z,
        zmin=-0.5,
        zmax=n - 0.5,
        colorscale=scale,
        showscale=False,
        text=labels if show_text else None,
        texttemplate="%{text}" if show_text else None,
        textfont={"size": 9},
    )
    return figure([trace], base_layout(**_grid_axes(nodes, columns, 22)))


def cluster_map(
    node_values: Sequence[tuple[str, float | None, str]],
    metric: Metric,
    *,
    columns: int = 50,
    hung: Collection[str] = frozenset(),
) -> go.Figure:
    """Every node as one cell (its mean of ``metric``), ``columns`` per row: the whole cluster at a glance.

    ``node_values`` is (node, value, hover text) in display order; a click's x and y give the node's position. The
    nodes in ``hung`` (a GPU of theirs hung: a stalled job's, a hung driver's) are drawn orange over their value, as
    the heatmap draws their GPUs: a hung GPU can read 100 % busy.
    """
    if not node_values:
        return empty_figure("no nodes")
    columns = max(1, min(columns, len(node_values)))
    rows = math.ceil(len(node_values) / columns)
    z: list[list[float | None]] = [[None] * columns for _ in range(rows)]
    overlay: list[list[float | None]] = [[None] * columns for _ in range(rows)]
    hover: list[list[str]] = [[""] * columns for _ in range(rows)]
    for i, (node, value, text) in enumerate(node_values):
        row, col = divmod(i, columns)
        z[row][col] = round_sig(value, 3)
        hover[row][col] = text or node
        if node in hung:
            overlay[row][col] = 1.0
    cells = {"customdata": hover, "hovertemplate": "%{customdata}<extra></extra>", "xgap": 1, "ygap": 1}
    traces = [
        go.Heatmap(
            z=z,
            zmin=metric.zmin,
            zmax=metric.zmax,
            colorscale=colorscale(metric.colorscale),
            showscale=False,
            name=metric.label,
            **cells,
            **VALIDATE,
        )
    ]
    if hung:
        traces.append(
            go.Heatmap(
                z=overlay,
                zmin=0,
                zmax=1,
                colorscale=[[0, HUNG_COLOR], [1, HUNG_COLOR]],
                showscale=False,
                name="hung",
                **(cells | {"customdata": _covered(hover, overlay), "hoverongaps": False}),
                **VALIDATE,
            )
        )
    return figure(
        traces,
        base_layout(
            height=40 + 16 * rows,
            margin={"l": 4, "r": 4, "t": 4, "b": 4},
            xaxis={"visible": False, "fixedrange": True},
            yaxis={"visible": False, "autorange": "reversed", "fixedrange": True},
        ),
    )
