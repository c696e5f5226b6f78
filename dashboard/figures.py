"""Figure builders: pure functions from records to Plotly figures. No I/O, no Dash, no clock: tests call them directly.

Figures are theme-free (transparent backgrounds; the stylesheet colours text and grid lines for light and dark), put
times on the x axis as integer milliseconds since the epoch (UTC; half the bytes of ISO strings) and round values to
four significant digits, so the JSON a page receives stays small.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import plotly.graph_objects as go

from dashboard.paths import gpu_path, job_path
from gpulens.model import THROTTLE_REASONS, GpuJob, GpuReading

# A qualitative palette (one colour per GPU index or job), readable on light and dark backgrounds.
PALETTE: Final = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#76b7b2",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#86bcb6",
    "#d37295",
    "#a0cbe8",
)
LIMIT_COLOR: Final = "#c62828"
DOWN_COLOR: Final = "#c62828"
STALE_COLOR: Final = "#8a93a3"
PERIOD_COLORS: Final = {
    "stall": "rgba(198,40,40,0.16)",
    "straggler": "rgba(240,165,58,0.20)",
    "idle": "rgba(47,111,214,0.14)",
}

# PCIe payload rate per lane per direction by generation (bytes/s), DOMAIN.md section 1.
PCIE_LANE_BYTES_PER_SECOND: Final = {1: 0.25e9, 2: 0.5e9, 3: 0.985e9, 4: 1.969e9, 5: 3.938e9}
# NVLink 2, 3 and 4 (V100, A100, H100, H200) carry 25 GB/s per link per direction.
NVLINK_LINK_BYTES_PER_SECOND: Final = 25e9

MISSING: Final = "\u2013"  # what a table or card shows for a value that was not read
_HOVER_LABEL: Final = {"bgcolor": "#1d2330", "bordercolor": "#1d2330", "font": {"color": "#f2f4f8", "size": 12}}


# --- formatting -----------------------------------------------------------------------------------------------------


def round_sig(value: float | None, digits: int = 4) -> float | None:
    """``value`` to ``digits`` significant digits (smaller JSON); ``None`` and non-finite values become ``None``."""
    if value is None or not math.isfinite(value):
        return None
    if value == 0:
        return 0.0
    return round(value, digits - 1 - math.floor(math.log10(abs(value))))


def percent_text(ratio: float | None) -> str:
    return MISSING if ratio is None else f"{ratio * 100:.0f}%"


def bytes_text(value: float | None) -> str:
    """Memory sizes in binary units, as nvidia-smi shows them."""
    if value is None:
        return MISSING
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(value) >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:.0f} B"


def rate_text(value: float | None) -> str:
    """Throughput in decimal units, as link datasheets give it."""
    if value is None:
        return MISSING
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:.0f} B/s"


def watts_text(value: float | None) -> str:
    if value is None:
        return MISSING
    return f"{value / 1000:.1f} kW" if value >= 10_000 else f"{value:.0f} W"


def celsius_text(value: float | None) -> str:
    return MISSING if value is None else f"{value:.0f} °C"


def duration_text(seconds: float | None) -> str:
    """``3d 4h``, ``2h 05m``, ``7m``, ``40s``."""
    if seconds is None:
        return MISSING
    s = max(0, int(seconds))
    if s >= 86400:
        return f"{s // 86400}d {s % 86400 // 3600}h"
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m"
    return f"{s}s"


def gpu_label(node: str, index: int) -> str:
    """``node-01:3``: how a person names a GPU."""
    return f"{node}:{index}"


# --- link ceilings --------------------------------------------------------------------------------------------------


def pcie_max_bytes_per_second(generation: int | None, width: int | None) -> float | None:
    """The per-direction payload ceiling of a PCIe link of this generation and width."""
    lane = PCIE_LANE_BYTES_PER_SECOND.get(generation or 0)
    return lane * width if lane is not None and width else None


def nvlink_max_bytes_per_second(links_active: int | None) -> float | None:
    """The per-direction NVLink ceiling of a GPU with this many active links; ``None`` without NVLink."""
    return links_active * NVLINK_LINK_BYTES_PER_SECOND if links_active else None


def _busiest_direction(tx: float | None, rx: float | None) -> float | None:
    present = [v for v in (tx, rx) if v is not None]
    return max(present) if present else None


def pcie_ratio(r: GpuReading) -> float | None:
    """The busier PCIe direction as a share of the current link's ceiling."""
    ceiling = pcie_max_bytes_per_second(r.pcie_link_generation, r.pcie_link_width)
    busiest = _busiest_direction(r.pcie_tx_bytes_per_second, r.pcie_rx_bytes_per_second)
    return busiest / ceiling if busiest is not None and ceiling else None


def nvlink_ratio(r: GpuReading) -> float | None:
    ceiling = nvlink_max_bytes_per_second(r.nvlink_links_active)
    busiest = _busiest_direction(r.nvlink_tx_bytes_per_second, r.nvlink_rx_bytes_per_second)
    return busiest / ceiling if busiest is not None and ceiling else None


def memory_ratio(r: GpuReading) -> float | None:
    if r.memory_used_bytes is None or not r.memory_total_bytes:
        return None
    return r.memory_used_bytes / r.memory_total_bytes


def power_ratio(r: GpuReading) -> float | None:
    if r.power_watts is None or not r.power_limit_watts:
        return None
    return r.power_watts / r.power_limit_watts


def pcie_degraded(r: GpuReading) -> bool:
    """The link trained below its maximum generation or width (a classic hardware fault)."""
    gen, gen_max = r.pcie_link_generation, r.pcie_link_generation_max
    width, width_max = r.pcie_link_width, r.pcie_link_width_max
    return bool((gen and gen_max and gen < gen_max) or (width and width_max and width < width_max))


# --- heatmap metrics ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Metric:
    """What a node x GPU heatmap is coloured by."""

    key: str
    label: str
    value: Callable[[GpuReading], float | None]
    text: Callable[[float], str]
    zmin: float
    zmax: float
    colorscale: str
    ticks: tuple[tuple[float, str], ...] = ()


_RATIO_TICKS: Final = ((0.0, "0%"), (0.5, "50%"), (1.0, "100%"))

METRICS: Final[dict[str, Metric]] = {
    m.key: m
    for m in (
        Metric(
            "utilization", "Utilization", lambda r: r.utilization_ratio, percent_text, 0, 1, "Viridis", _RATIO_TICKS
        ),
        Metric("memory", "Memory used", memory_ratio, percent_text, 0, 1, "Cividis", _RATIO_TICKS),
        Metric("temperature", "Temperature", lambda r: r.temperature_celsius, celsius_text, 25, 95, "YlOrRd"),
        Metric("power", "Power (of limit)", power_ratio, percent_text, 0, 1, "Plasma", _RATIO_TICKS),
        Metric("pcie", "PCIe (of link max)", pcie_ratio, percent_text, 0, 1, "Tealgrn", _RATIO_TICKS),
        Metric("nvlink", "NVLink (of link max)", nvlink_ratio, percent_text, 0, 1, "Purp", _RATIO_TICKS),
    )
}
DEFAULT_METRIC: Final = "utilization"


def gpu_hover(r: GpuReading, jobs: Sequence[GpuJob] = ()) -> str:
    """The hover text of one GPU: where it is, what runs on it and its main readings."""
    lines = [f"<b>{gpu_label(r.node, r.gpu)}</b> {r.model}", r.uuid]
    if jobs:
        lines.append("job " + ", ".join(f"{j.job_id} ({j.user or '?'})" for j in jobs))
    if not r.up:
        lines.append("<b>GPU down</b> (lost or unreadable)")
        return "<br>".join(lines)
    lines.append(f"util {percent_text(r.utilization_ratio)} · mem {percent_text(memory_ratio(r))}")
    lines.append(
        f"{celsius_text(r.temperature_celsius)} · {watts_text(r.power_watts)} of {watts_text(r.power_limit_watts)}"
    )
    pcie, nvlink = pcie_ratio(r), nvlink_ratio(r)
    lines.append(f"PCIe {percent_text(pcie)} · NVLink {'none' if r.nvlink_links_active == 0 else percent_text(nvlink)}")
    if r.throttle_reasons:
        from gpulens.model import throttle_reason_names

        reasons = [n for n in throttle_reason_names(r.throttle_reasons) if n != "idle"]
        if reasons:
            lines.append("throttle: " + ", ".join(reasons))
    return "<br>".join(lines)


def _base_layout(**overrides: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "template": "none",  # Plotly's default template adds 7 kB to every figure for looks the stylesheet gives
        "paper_bgcolor": "rgba(0,0,0,0)",
        "plot_bgcolor": "rgba(0,0,0,0)",
        "margin": {"l": 56, "r": 16, "t": 12, "b": 36},
        "font": {"size": 12},
        "hoverlabel": _HOVER_LABEL,
        "showlegend": False,
    }
    layout.update(overrides)
    return layout


def empty_figure(message: str, height: int = 220) -> go.Figure:
    """A blank chart that says why it is blank (no data in the range, database down, ...)."""
    return go.Figure(
        layout=_base_layout(
            height=height,
            xaxis={"visible": False},
            yaxis={"visible": False},
            annotations=[{"text": message, "showarrow": False, "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5}],
        )
    )


@dataclass(frozen=True, slots=True)
class GridCell:
    """One GPU in a node x GPU grid."""

    reading: GpuReading
    jobs: tuple[GpuJob, ...] = ()
    stale: bool = False  # no reading for a while: its node's exporter or the collector is down


def _grid_axes(nodes: Sequence[str], columns: int, height_per_row: int) -> dict[str, Any]:
    return {
        "height": max(160, 70 + height_per_row * len(nodes)),
        "xaxis": {
            "title": {"text": "GPU"},
            "tickmode": "array",
            "tickvals": list(range(columns)),
            "side": "top",
            "showgrid": False,
            "fixedrange": True,
        },
        "yaxis": {"autorange": "reversed", "showgrid": False, "fixedrange": True, "automargin": True},
        "margin": {"l": 8, "r": 8, "t": 40, "b": 8},
    }


@dataclass(frozen=True, slots=True)
class _Cell:
    """What one grid cell shows: its colour value, hover text, the page a click opens, and the text inside it."""

    z: float | None
    hover: str
    path: str
    text: str = ""
    overlay: float | None = None  # 1: down, 0: stale (drawn over the values in their own colours)


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
) -> tuple[int, _Matrix]:
    by_key = {(c.reading.node, c.reading.gpu): c for c in cells}
    columns = max((c.reading.gpu for c in cells), default=-1) + 1
    rows = [
        [describe(cell) if (cell := by_key.get((node, i))) is not None else _EMPTY_CELL for i in range(columns)]
        for node in nodes
    ]
    return columns, _Matrix(
        z=[[c.z for c in row] for row in rows],
        hover=[[c.hover for c in row] for row in rows],
        path=[[c.path for c in row] for row in rows],
        text=[[c.text for c in row] for row in rows],
        overlay=[[c.overlay for c in row] for row in rows],
    )


def _cell_trace(m: _Matrix, nodes: Sequence[str], columns: int, **style: Any) -> go.Heatmap:
    return go.Heatmap(
        x=list(range(columns)),
        y=list(nodes),
        customdata=m.hover,
        hovertext=m.path,
        hovertemplate="%{customdata}<extra></extra>",
        xgap=2,
        ygap=2,
        **style,
    )


def gpu_heatmap(
    cells: Sequence[GridCell], nodes: Sequence[str], metric: Metric, *, show_text: bool = True
) -> go.Figure:
    """Nodes (rows, in the given order) x GPUs (columns) coloured by ``metric``; click a cell for its GPU page.

    Down GPUs are red, stale ones (no recent reading) grey, both with their own hover text.
    """
    if not cells:
        return empty_figure("no GPUs to show")

    def describe(cell: GridCell) -> _Cell:
        r = cell.reading
        value = metric.value(r) if r.up and not cell.stale else None
        hover = gpu_hover(r, cell.jobs)
        if cell.stale:
            hover += "<br><b>no recent reading</b> (exporter or collector down)"
        overlay = 1.0 if not r.up else 0.0 if cell.stale else None
        text = metric.text(value) if value is not None else ""
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
                z=m.overlay,
                zmin=0,
                zmax=1,
                colorscale=[[0, STALE_COLOR], [0.5, STALE_COLOR], [0.5, DOWN_COLOR], [1, DOWN_COLOR]],
                showscale=False,
                name="down or stale",
            )
        )
    return go.Figure(data=traces, layout=_base_layout(**_grid_axes(nodes, columns, 22)))


def job_grid(cells: Sequence[GridCell], nodes: Sequence[str], *, show_text: bool = True) -> go.Figure:
    """Which job holds which GPU: nodes x GPUs coloured by job (free GPUs blank); click a cell for its job.

    The jobs in the grid take the palette's colours in the order of their ids, so neighbours differ while there are
    fewer jobs than colours, and a refresh keeps each job's colour.
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
        return _Cell(float(slot[job]), hover, job_path(job), short)

    columns, m = _matrix(cells, nodes, describe)
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
        text=m.text if show_text else None,
        texttemplate="%{text}" if show_text else None,
        textfont={"size": 9},
    )
    return go.Figure(data=[trace], layout=_base_layout(**_grid_axes(nodes, columns, 22)))


def cluster_map(
    node_values: Sequence[tuple[str, float | None, str]], metric: Metric, *, columns: int = 50
) -> go.Figure:
    """Every node as one cell (its mean of ``metric``), ``columns`` per row: the whole cluster at a glance.

    ``node_values`` is (node, value, hover text) in display order; a click's x and y give the node's position.
    """
    if not node_values:
        return empty_figure("no nodes")
    columns = max(1, min(columns, len(node_values)))
    rows = math.ceil(len(node_values) / columns)
    z: list[list[float | None]] = [[None] * columns for _ in range(rows)]
    hover: list[list[str]] = [[""] * columns for _ in range(rows)]
    for i, (node, value, text) in enumerate(node_values):
        row, col = divmod(i, columns)
        z[row][col] = round_sig(value, 3)
        hover[row][col] = text or node
    trace = go.Heatmap(
        z=z,
        customdata=hover,
        zmin=metric.zmin,
        zmax=metric.zmax,
        colorscale=metric.colorscale,
        showscale=False,
        hovertemplate="%{customdata}<extra></extra>",
        xgap=1,
        ygap=1,
    )
    return go.Figure(
        data=[trace],
        layout=_base_layout(
            height=40 + 16 * rows,
            margin={"l": 4, "r": 4, "t": 4, "b": 4},
            xaxis={"visible": False, "fixedrange": True},
            yaxis={"visible": False, "autorange": "reversed", "fixedrange": True},
        ),
    )


# --- time series ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Line:
    """One line of a time-series chart: times in seconds since the epoch, values in SI units (``None``: a gap)."""

    name: str
    times: Sequence[float]
    values: Sequence[float | None]
    color: str = PALETTE[0]
    dash: str | None = None  # "dash", "dot": limits and second series
    group: str | None = None  # legend group: one legend click hides a GPU's lines in a chart
    width: float = 1.6


@dataclass(frozen=True, slots=True)
class Period:
    """A span to mark on a chart (a stall, a straggler): seconds since the epoch."""

    start: float
    end: float
    kind: str  # "stall" | "straggler" | "idle"
    label: str


@dataclass(frozen=True, slots=True)
class Axis:
    """How a chart's y axis reads: Plotly tick format and suffix, the hover format, and a scale applied to values
    (memory in GiB: Plotly's SI prefixes are decimal)."""

    tickformat: str = ""
    ticksuffix: str = ""
    hoverformat: str = ".3s"
    range: tuple[float, float] | None = None
    scale: float = 1.0
    from_zero: bool = True


PERCENT: Final = Axis(tickformat=".0%", hoverformat=".1%", range=(0, 1.05))
GIB: Final = Axis(ticksuffix=" GiB", hoverformat=".1f", scale=1 / 1024**3)
RATE: Final = Axis(tickformat=".3~s", ticksuffix="B/s", hoverformat=".4~s")
CELSIUS: Final = Axis(ticksuffix=" °C", hoverformat=".1f", from_zero=False)
WATTS: Final = Axis(ticksuffix=" W", hoverformat=".0f")
HERTZ: Final = Axis(tickformat=".3~s", ticksuffix="Hz", hoverformat=".4~s")
PER_SECOND: Final = Axis(tickformat=".3~s", ticksuffix="/s", hoverformat=".3~s")


def _ms(times: Iterable[float]) -> list[int]:
    return [round(t * 1000) for t in times]


def time_series(
    lines: Sequence[Line],
    axis: Axis,
    *,
    start: float,
    end: float,
    periods: Sequence[Period] = (),
    height: int = 240,
    legend: bool = True,
    empty: str = "no data in this range",
) -> go.Figure:
    """Lines over [start, end] with optional marked periods; limits are lines too (dashed)."""
    drawn = [line for line in lines if any(v is not None for v in line.values)]
    if not drawn:
        return empty_figure(empty, height)
    traces = [
        go.Scatter(
            x=_ms(line.times),
            y=[round_sig(v * axis.scale) if v is not None else None for v in line.values],
            name=line.name,
            mode="lines",
            line={"color": line.color, "dash": line.dash, "width": line.width},
            legendgroup=line.group,
            connectgaps=False,
            hovertemplate=f"{line.name}: %{{y:{axis.hoverformat}}}{axis.ticksuffix}<extra></extra>",
        )
        for line in drawn
    ]
    yaxis: dict[str, Any] = {"tickformat": axis.tickformat, "ticksuffix": axis.ticksuffix, "zeroline": False}
    if axis.range is not None:
        yaxis["range"] = list(axis.range)
    elif axis.from_zero:
        yaxis["rangemode"] = "tozero"
    layout = _base_layout(
        height=height,
        hovermode="x unified",
        xaxis={"type": "date", "range": [round(start * 1000), round(end * 1000)]},
        yaxis=yaxis,
        showlegend=legend,
        legend={"orientation": "h", "y": -0.22, "font": {"size": 11}},
        margin={"l": 64, "r": 16, "t": 12, "b": 36},
        shapes=[_period_shape(p) for p in periods],
        annotations=[_period_label(p) for p in periods],
    )
    return go.Figure(data=traces, layout=layout)


def _period_shape(p: Period) -> dict[str, Any]:
    return {
        "type": "rect",
        "xref": "x",
        "yref": "paper",
        "x0": round(p.start * 1000),
        "x1": round(p.end * 1000),
        "y0": 0,
        "y1": 1,
        "fillcolor": PERIOD_COLORS.get(p.kind, PERIOD_COLORS["stall"]),
        "line": {"width": 0},
        "layer": "below",
    }


def _period_label(p: Period) -> dict[str, Any]:
    return {
        "x": round((p.start + p.end) / 2 * 1000),
        "xref": "x",
        "y": 1,
        "yref": "paper",
        "yanchor": "bottom",
        "text": p.label,
        "showarrow": False,
        "font": {"size": 11},
    }


# --- throttle reasons -----------------------------------------------------------------------------------------------

REASON_COLORS: Final = {
    "idle": "#a7b0bf",
    "applications_clocks": "#76b7b2",
    "sw_power_cap": "#f28e2b",
    "hw_slowdown": "#b8002e",
    "sync_boost": "#59a14f",
    "sw_thermal": "#e15759",
    "hw_thermal": "#8f1d2c",
    "hw_power_brake": "#7b3fa0",
    "display_clocks": "#9c755f",
}


@dataclass(frozen=True, slots=True)
class MaskSeries:
    """A GPU's throttle-reason bitmask over time (OR-ed over each bucket when downsampled)."""

    label: str
    times: Sequence[float]
    masks: Sequence[int | None]


def throttle_timeline(
    series: Sequence[MaskSeries], *, start: float, end: float, periods: Sequence[Period] = ()
) -> go.Figure:
    """One row per GPU and reason that occurred, a bar where the reason was set."""
    traces = []
    rows: list[str] = []
    for s in series:
        for name, bit in THROTTLE_REASONS:
            flags = [m is not None and bool(m & bit) for m in s.masks]
            if not any(flags):
                continue
            row = f"{s.label} {name}"
            rows.append(row)
            traces.append(
                go.Scatter(
                    x=_ms(s.times),
                    y=[row if f else None for f in flags],
                    mode="lines+markers",
                    line={"color": REASON_COLORS[name], "width": 9},
                    marker={"color": REASON_COLORS[name], "symbol": "square", "size": 7},
                    connectgaps=False,
                    name=name,
                    hovertemplate=f"{s.label}: {name}<extra></extra>",
                )
            )
    if not traces:
        return empty_figure("no throttling in this range", 120)
    return go.Figure(
        data=traces,
        layout=_base_layout(
            height=max(140, 60 + 18 * len(rows)),
            xaxis={"type": "date", "range": [round(start * 1000), round(end * 1000)]},
            yaxis={"type": "category", "categoryorder": "array", "categoryarray": rows[::-1], "automargin": True},
            margin={"l": 8, "r": 16, "t": 12, "b": 40},
            shapes=[_period_shape(p) for p in periods],
        ),
    )


# --- GPU x time heatmaps (job pages) --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Row:
    """One GPU's series for a GPU x time heatmap."""

    label: str
    times: Sequence[float]
    values: Sequence[float | None]


def bin_values(
    times: Sequence[float], values: Sequence[float | None], start: float, end: float, bins: int
) -> list[float | None]:
    """The mean of ``values`` in each of ``bins`` equal spans of [start, end) (``None`` where a span has none)."""
    sums = [0.0] * bins
    counts = [0] * bins
    width = (end - start) / bins
    for t, v in zip(times, values, strict=True):
        if v is None or not start <= t < end:
            continue
        i = min(bins - 1, int((t - start) / width))
        sums[i] += v
        counts[i] += 1
    return [s / c if c else None for s, c in zip(sums, counts, strict=True)]


def gpu_time_heatmap(
    rows: Sequence[Row],
    metric: Metric,
    *,
    start: float,
    end: float,
    bins: int = 120,
    periods: Sequence[Period] = (),
    autoscale: bool = False,
) -> go.Figure:
    """GPUs (rows) x time (columns) coloured by ``metric``'s scale: a whole job's GPUs at once, any job size.

    With ``autoscale`` the colour scale tops out at the largest value shown (at least 5%), so that traffic far below
    a link's ceiling still shows its changes.
    """
    if not rows or not any(v is not None for r in rows for v in r.values):
        return empty_figure("no data in this range")
    width = (end - start) / bins
    centres = [round((start + (i + 0.5) * width) * 1000) for i in range(bins)]
    z = [[round_sig(v, 3) for v in bin_values(r.times, r.values, start, end, bins)] for r in rows]
    zmax = metric.zmax
    if autoscale:
        zmax = max([0.05, *(v for row in z for v in row if v is not None)])
    colorbar: dict[str, Any] = {"title": {"text": metric.label, "side": "right"}, "thickness": 12}
    if metric.ticks:
        ticks = [0.0, zmax / 2, zmax]
        colorbar.update(tickvals=ticks, ticktext=[metric.text(v) for v in ticks])
    trace = go.Heatmap(
        z=z,
        x=centres,
        y=[r.label for r in rows],
        zmin=metric.zmin,
        zmax=zmax,
        colorscale=metric.colorscale,
        colorbar=colorbar,
        hovertemplate="%{y}<br>%{x}<br>%{z:.0%}<extra></extra>"
        if metric.ticks
        else "%{y}<br>%{x}<br>%{z}<extra></extra>",
        ygap=1,
    )
    return go.Figure(
        data=[trace],
        layout=_base_layout(
            height=max(180, 70 + 16 * len(rows)),
            xaxis={"type": "date", "range": [round(start * 1000), round(end * 1000)]},
            yaxis={"autorange": "reversed", "automargin": True, "type": "category"},
            margin={"l": 8, "r": 16, "t": 20, "b": 40},
            shapes=[_period_outline(p) for p in periods],
            annotations=[_period_label(p) for p in periods],
        ),
    )


def _period_outline(p: Period) -> dict[str, Any]:
    shape = _period_shape(p)
    color = {"stall": "#c62828", "straggler": "#f0a53a", "idle": "#2f6fd6"}.get(p.kind, "#c62828")
    shape.update(fillcolor="rgba(0,0,0,0)", line={"width": 2, "color": color, "dash": "dot"}, layer="above")
    return shape


# --- interconnect ---------------------------------------------------------------------------------------------------


LOAD_BIN: Final = 0.05  # the density's cell: 5% of the link maximum on each axis
LOAD_TOP: Final = 200  # the busiest GPUs drawn as their own (clickable) points


def link_load(readings: Sequence[GpuReading], *, top: int = LOAD_TOP) -> go.Figure:
    """Every GPU up against its link maximums: its busier PCIe direction (x) and NVLink direction (y) as shares of the
    links' ceilings. A density counts every GPU in 5% cells (any cluster size, a few kB); the ``top`` busiest GPUs are
    drawn as points with their names, a click opening the GPU. Saturated links sit at the right or top edge; GPUs
    without NVLink sit at 0 on the y axis.
    """
    loads = []
    for r in readings:
        if not r.up or (r.pcie_link_generation is None and r.nvlink_links_active is None):
            continue
        loads.append((pcie_ratio(r) or 0.0, (nvlink_ratio(r) or 0.0) if r.nvlink_links_active else 0.0, r))
    if not loads:
        return empty_figure("no PCIe or NVLink readings", 380)
    cells = math.ceil(1 / LOAD_BIN) + 1  # the last cell holds 100% and above
    counts: list[list[int | None]] = [[None] * cells for _ in range(cells)]
    for x, y, _ in loads:
        row, col = min(cells - 1, int(y / LOAD_BIN)), min(cells - 1, int(x / LOAD_BIN))
        counts[row][col] = (counts[row][col] or 0) + 1
    centres = [round((i + 0.5) * LOAD_BIN, 3) for i in range(cells)]
    density = go.Heatmap(
        z=counts,
        x=centres,
        y=centres,
        colorscale="Blues",
        showscale=False,
        hovertemplate="%{z} GPUs at PCIe ~%{x:.0%}, NVLink ~%{y:.0%}<extra></extra>",
        name="all GPUs",
    )
    busiest = sorted(loads, key=lambda load: -max(load[0], load[1]))[:top]
    points = go.Scatter(
        x=[round_sig(x, 3) for x, _, _ in busiest],
        y=[round_sig(y, 3) for _, y, _ in busiest],
        customdata=[gpu_path(r.uuid) for _, _, r in busiest],
        text=[gpu_label(r.node, r.gpu) for _, _, r in busiest],
        mode="markers",
        name=f"the {len(busiest)} busiest GPUs",
        marker={"size": 7, "color": PALETTE[1], "opacity": 0.85, "line": {"width": 0.5, "color": "#ffffff"}},
        hovertemplate="%{text}<br>PCIe %{x:.0%} · NVLink %{y:.0%}<extra></extra>",
    )
    line = {"color": LIMIT_COLOR, "dash": "dash", "width": 1}
    return go.Figure(
        data=[density, points],
        layout=_base_layout(
            height=380,
            showlegend=True,
            legend={"orientation": "h", "y": -0.18},
            xaxis={"title": {"text": "PCIe, busier direction, of link max"}, "tickformat": ".0%", "range": [0, 1.05]},
            yaxis={"title": {"text": "NVLink, of link max"}, "tickformat": ".0%", "range": [0, 1.05]},
            shapes=[
                {"type": "line", "xref": "x", "yref": "paper", "x0": 1, "x1": 1, "y0": 0, "y1": 1, "line": line},
                {"type": "line", "xref": "paper", "yref": "y", "x0": 0, "x1": 1, "y0": 1, "y1": 1, "line": line},
            ],
        ),
    )


def node_topology(readings: Sequence[GpuReading], down_links: Mapping[str, int] | None = None) -> go.Figure:
    """A node's GPUs around its NVSwitch fabric: an edge per GPU, as wide as its active links and coloured by load
    (green idle to red saturated; red dotted without NVLink on an NVLink node). Each GPU shows its PCIe link; a GPU
    that is down, has NVLinks down or a PCIe link below its maximum is red. Click a GPU for its page.

    ``down_links`` counts inactive NVLinks per GPU UUID, where known.
    """
    gpus = sorted(readings, key=lambda r: r.gpu)
    if not gpus:
        return empty_figure("no GPUs on this node", 380)
    down = down_links or {}
    n = len(gpus)
    angle = [math.pi / 2 - 2 * math.pi * i / n for i in range(n)]
    xs = [math.cos(a) for a in angle]
    ys = [math.sin(a) for a in angle]
    has_fabric = any(r.nvlink_links_active for r in gpus)
    traces: list[Any] = []
    if has_fabric:
        for r, x, y in zip(gpus, xs, ys, strict=True):
            if r.nvlink_links_active:
                width = 1 + r.nvlink_links_active / 3
                traces.append(_edge((0.0, 0.0), (x, y), width, _load_color(nvlink_ratio(r) or 0.0), None))
            else:
                traces.append(_edge((0.0, 0.0), (x, y), 2, DOWN_COLOR, "dot"))
    labels, hovers, colors = [], [], []
    for r in gpus:
        missing = down.get(r.uuid, 0)
        degraded = pcie_degraded(r)
        labels.append(f"<b>GPU {r.gpu}</b><br>Gen{r.pcie_link_generation or '?'} x{r.pcie_link_width or '?'}")
        hover = [f"<b>{gpu_label(r.node, r.gpu)}</b>", r.uuid]
        if r.nvlink_links_active is not None:
            ceiling = rate_text(nvlink_max_bytes_per_second(r.nvlink_links_active))
            hover.append(f"NVLink {r.nvlink_links_active} links active" + (f", {missing} down" if missing else ""))
            hover.append(f"NVLink load {percent_text(nvlink_ratio(r))} of {ceiling}")
        hover.append(
            f"PCIe Gen{r.pcie_link_generation or '?'} x{r.pcie_link_width or '?'}"
            f" (max Gen{r.pcie_link_generation_max or '?'} x{r.pcie_link_width_max or '?'})"
            + (" <b>degraded</b>" if degraded else "")
            + f", load {percent_text(pcie_ratio(r))}"
        )
        hovers.append("<br>".join(hover))
        colors.append(DOWN_COLOR if (not r.up or missing or degraded) else PALETTE[0])
    traces.append(
        go.Scatter(
            x=xs,
            y=ys,
            mode="markers+text",
            text=labels,
            textposition="middle center",
            textfont={"color": "#ffffff", "size": 10},
            marker={"size": 54, "color": colors, "symbol": "square", "line": {"width": 0}},
            customdata=[gpu_path(r.uuid) for r in gpus],
            hovertext=hovers,
            hoverinfo="text",
        )
    )
    if has_fabric:
        traces.append(
            go.Scatter(
                x=[0.0],
                y=[0.0],
                mode="markers+text",
                text=["NVSwitch"],
                textposition="bottom center",
                marker={"size": 24, "color": STALE_COLOR, "symbol": "diamond"},
                hoverinfo="skip",
            )
        )
    return go.Figure(
        data=traces,
        layout=_base_layout(
            height=380,
            xaxis={"visible": False, "range": [-1.45, 1.45], "fixedrange": True},
            yaxis={"visible": False, "range": [-1.3, 1.3], "scaleanchor": "x", "fixedrange": True},
            margin={"l": 4, "r": 4, "t": 4, "b": 4},
        ),
    )


def _edge(a: tuple[float, float], b: tuple[float, float], width: float, color: str, dash: str | None) -> go.Scatter:
    return go.Scatter(
        x=[a[0], b[0]],
        y=[a[1], b[1]],
        mode="lines",
        line={"width": width, "color": color, "dash": dash},
        hoverinfo="skip",
    )


def _load_color(ratio: float) -> str:
    """Green (idle link) to red (saturated)."""
    ratio = max(0.0, min(1.0, ratio))
    red = round(60 + 180 * ratio)
    green = round(170 - 120 * ratio)
    return f"rgb({red},{green},80)"


# --- small helpers shared by pages ----------------------------------------------------------------------------------


def palette_color(index: int) -> str:
    return PALETTE[index % len(PALETTE)]
