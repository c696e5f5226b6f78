"""Throttle-reason figures: a timeline with one row per GPU and throttle reason that occurred."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import plotly.graph_objects as go

from gpulens.dashboard.figures.periods import Period, period_shape
from gpulens.dashboard.figures.style import VALIDATE, base_layout, empty_figure, epoch_ms, figure
from gpulens.dashboard.formatting import plotly_text
from gpulens.model import THROTTLE_REASONS

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
                    x=epoch_ms(s.times),
                    y=[row if f else None for f in flags],
                    mode="lines+markers",
                    line={"color": REASON_COLORS[name], "width": 9},
                    marker={"color": REASON_COLORS[name], "symbol": "square", "size": 7},
                    connectgaps=False,
                    name=name,
                    hovertemplate=f"{plotly_text(s.label)}: {name}<extra></extra>",
                    **VALIDATE,
                )
            )
    if not traces:
        return empty_figure("no throttling in this range", 120)
    return figure(
        traces,
        base_layout(
            height=max(140, 60 + 18 * len(rows)),
            xaxis={"type": "date", "range": [round(start * 1000), round(end * 1000)]},
            yaxis={"type": "category", "categoryorder": "array", "categoryarray": rows[::-1], "automargin": True},
            margin={"l": 8, "r": 16, "t": 12, "b": 40},
            shapes=[period_shape(p) for p in periods],
        ),
    )
