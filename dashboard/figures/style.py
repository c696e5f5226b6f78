"""Figure style: the palette and colours, the layout every figure starts from, and the figure that says why it is
blank. Figures are theme-free: transparent backgrounds, the stylesheet colours text and grid lines.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Sequence
from typing import Any, Final

import plotly.colors
import plotly.graph_objects as go

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
HUNG_COLOR: Final = "#e8590c"  # a hung GPU: busy-looking readings, no progress
_HOVER_LABEL: Final = {"bgcolor": "#1d2330", "bordercolor": "#1d2330", "font": {"color": "#f2f4f8", "size": 12}}


VALIDATE: Final[dict[str, Any]] = {"_validate": False}  # for traces: go.Scatter(..., **VALIDATE); see ``figure``


def palette_color(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


# A node's health (``gpulens.nodehealth`` states), as the overview colours its nodes.
HEALTH_COLORS: Final = {"Healthy": "#2f9e44", "Degraded": "#f08c00", "Unhealthy": DOWN_COLOR}

# A link's state, said by its colour on the interconnect views; its load is said by its label and width.
LINK_HEALTHY: Final = "healthy"  # up, carrying traffic
LINK_IDLE: Final = "idle"  # up, carrying (almost) nothing: not a sign of health, nor of trouble
LINK_DEGRADED: Final = "degraded"  # up below its best (fewer lanes, a lower rate, NVLinks down)
LINK_DOWN: Final = "down"
LINK_UNKNOWN: Final = "unknown"  # no recent reading
LINK_COLORS: Final = {
    LINK_HEALTHY: "#2f9e44",
    LINK_IDLE: "#ced4da",
    LINK_DEGRADED: "#f08c00",
    LINK_DOWN: DOWN_COLOR,
    LINK_UNKNOWN: STALE_COLOR,
}
LINK_TEXT_COLORS: Final = {LINK_IDLE: "#343a40"}  # dark text on the pale idle colour; white on the others
IDLE_LINK_BELOW: Final = 0.01  # of its rate: a link this quiet is idle


def link_state(up: bool, degraded: bool, load: float | None) -> str:
    """A link's state: down, degraded, unknown (no load known), idle (under 1 % of its rate) or healthy."""
    if not up:
        return LINK_DOWN
    if degraded:
        return LINK_DEGRADED
    if load is None:
        return LINK_UNKNOWN
    return LINK_IDLE if load < IDLE_LINK_BELOW else LINK_HEALTHY


def epoch_ms(times: Iterable[float]) -> list[int]:
    """Seconds since the epoch as the integer milliseconds a date axis takes (half the bytes of ISO strings)."""
    return [round(t * 1000) for t in times]


def epoch_x(times: Iterable[float]) -> dict[str, Any]:
    """A trace's x on a date axis: ``x0`` and ``dx`` where the times are evenly spaced (a rolled-up tier's are: one
    number each, not one per point, the most of a node page's bytes), else ``x`` as ``epoch_ms``."""
    ms = epoch_ms(times)
    if len(ms) >= 3 and all(b - a == ms[1] - ms[0] for a, b in itertools.pairwise(ms)) and ms[1] > ms[0]:
        return {"x0": ms[0], "dx": ms[1] - ms[0]}
    return {"x": ms}


def base_layout(**overrides: Any) -> dict[str, Any]:
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


@functools.cache
def colorscale(name: str) -> list[list[float | str]]:
    """A named Plotly colour scale as the list of ``[stop, colour]`` that validation would have made of it, for
    unvalidated traces (plotly.js knows only some of Python's names)."""
    return [[float(stop), str(color)] for stop, color in plotly.colors.get_colorscale(name)]


def figure(data: Sequence[Any] = (), layout: dict[str, Any] | None = None) -> go.Figure:
    """A figure of ``data`` (traces made with ``VALIDATE``) and ``layout``, without Plotly's property validation.

    Validation builds and checks an object per property: about 50 ms for a chart of 30 lines, a second for the node
    page's 20 charts. The figures here are built by this package from fixed keys, and tests check what they hold.
    """
    shown = dict(layout or {})
    if shown.get("template") == "none":  # what validation would have made of it
        shown["template"] = {"data": {"scatter": [{"type": "scatter"}]}}
    return go.Figure(data=list(data), layout=shown, **VALIDATE)


def empty_figure(message: str, height: int = 220) -> go.Figure:
    """A blank chart that says why it is blank (no data in the range, database down, ...)."""
    return figure(
        layout=base_layout(
            height=height,
            xaxis={"visible": False},
            yaxis={"visible": False},
            annotations=[{"text": message, "showarrow": False, "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5}],
        )
    )
