"""Time-series figures: lines over a time range against an axis (percent, GiB, rates, ...), limits drawn as dashed
lines, marked periods shaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import plotly.graph_objects as go

from gpulens.dashboard.figures.periods import Period, period_label, period_shape
from gpulens.dashboard.figures.style import PALETTE, VALIDATE, base_layout, empty_figure, epoch_x, figure
from gpulens.dashboard.formatting import plotly_text, round_sig


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
    """Lines over [start, end] with optional marked periods; limits are lines too (dashed).

    The x axis spans the data the lines have: from their first sample when that comes after ``start`` (a node that
    began reporting ten minutes ago fills the chart, not its right sixth). Lines with the same values at the same
    times are drawn as one (``merge_identical``), named after all of them, and a note on the chart says which
    series coincide, so eight equal lines do not read as one GPU's.
    """
    drawn, same = merge_identical([line for line in lines if any(v is not None for v in line.values)])
    if not drawn:
        return empty_figure(empty, height)
    first = min(line.times[0] for line in drawn if line.times)
    x0 = max(start, first) if first < end else start
    traces = [
        go.Scatter(
            **epoch_x(line.times),
            y=[round_sig(v * axis.scale) if v is not None else None for v in line.values],
            name=plotly_text(line.name),
            mode="lines",
            line={"color": line.color, "dash": line.dash, "width": line.width},
            legendgroup=line.group,
            connectgaps=False,
            hovertemplate=f"{plotly_text(line.name)}: %{{y:{axis.hoverformat}}}{axis.ticksuffix}<extra></extra>",
            **VALIDATE,
        )
        for line in drawn
    ]
    yaxis: dict[str, Any] = {"tickformat": axis.tickformat, "ticksuffix": axis.ticksuffix, "zeroline": False}
    if axis.range is not None:
        yaxis["range"] = list(axis.range)
    elif axis.from_zero:
        yaxis["rangemode"] = "tozero"
    layout = base_layout(
        height=height,
        hovermode="x unified",
        xaxis={"type": "date", "range": [round(x0 * 1000), round(end * 1000)]},
        yaxis=yaxis,
        showlegend=legend,
        legend={"orientation": "h", "y": -0.22, "font": {"size": 11}},
        margin={"l": 64, "r": 16, "t": 30 if same else 12, "b": 36},
        shapes=[period_shape(p) for p in periods],
        annotations=[period_label(p) for p in periods] + ([_same_note(same)] if same else []),
    )
    return figure(traces, layout)


def merge_identical(lines: Sequence[Line]) -> tuple[list[Line], list[list[str]]]:
    """The lines with each set of identical ones (same times, values and dash) drawn once, named ``GPU 0 = GPU 1``
    and a little wider; and the names of each solid set of two or more (limits coincide by design: not noted)."""
    groups: dict[tuple[object, ...], list[Line]] = {}
    for line in lines:
        groups.setdefault((tuple(line.times), tuple(line.values), line.dash), []).append(line)
    out: list[Line] = []
    same: list[list[str]] = []
    for members in groups.values():
        head = members[0]
        if len(members) == 1:
            out.append(head)
            continue
        names = [m.name for m in members]
        out.append(Line(" = ".join(names), head.times, head.values, head.color, head.dash, head.group, head.width + 1))
        if head.dash is None:
            same.append(names)
    return out, same


def _same_note(groups: Sequence[Sequence[str]]) -> dict[str, Any]:
    """The note that says which series draw one line: ``one line each: GPU 0, GPU 1 · GPU 4, GPU 5``."""

    def names(group: Sequence[str]) -> str:
        return ", ".join(group[:6]) + (f" and {len(group) - 6} more" if len(group) > 6 else "")

    return {
        "text": plotly_text("read the same, drawn as one line: " + " · ".join(names(g) for g in groups[:3])),
        "xref": "paper",
        "yref": "paper",
        "x": 0,
        "y": 1,
        "xanchor": "left",
        "yanchor": "bottom",
        "yshift": 15,  # above the marked periods' labels
        "showarrow": False,
        "font": {"size": 10},
    }
