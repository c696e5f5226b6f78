"""Time-series figures: lines over a time range against an axis (percent, GiB, rates, ...), limits drawn as dashed
lines, marked periods shaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import plotly.graph_objects as go

from gpulens.dashboard.figures.periods import Period, period_label, period_shape
from gpulens.dashboard.figures.style import PALETTE, VALIDATE, base_layout, empty_figure, epoch_ms, figure
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
    """Lines over [start, end] with optional marked periods; limits are lines too (dashed)."""
    drawn = [line for line in lines if any(v is not None for v in line.values)]
    if not drawn:
        return empty_figure(empty, height)
    traces = [
        go.Scatter(
            x=epoch_ms(line.times),
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
        xaxis={"type": "date", "range": [round(start * 1000), round(end * 1000)]},
        yaxis=yaxis,
        showlegend=legend,
        legend={"orientation": "h", "y": -0.22, "font": {"size": 11}},
        margin={"l": 64, "r": 16, "t": 12, "b": 36},
        shapes=[period_shape(p) for p in periods],
        annotations=[period_label(p) for p in periods],
    )
    return figure(traces, layout)
