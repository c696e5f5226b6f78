"""Marked periods: a span of time to mark on a chart (a stall, a straggler, an idle job), and the shapes and labels
that draw one on any date axis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

PERIOD_COLORS: Final = {
    "stall": "rgba(198,40,40,0.16)",
    "straggler": "rgba(240,165,58,0.20)",
    "idle": "rgba(47,111,214,0.14)",
}


@dataclass(frozen=True, slots=True)
class Period:
    """A span to mark on a chart (a stall, a straggler): seconds since the epoch."""

    start: float
    end: float
    kind: str  # "stall" | "straggler" | "idle"
    label: str


def period_shape(p: Period) -> dict[str, Any]:
    """The period as a shaded band behind the data, the full height of the plot."""
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


def period_label(p: Period) -> dict[str, Any]:
    """The period's name, written above the plot at its middle."""
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


def period_outline(p: Period) -> dict[str, Any]:
    """The period as a dotted outline over the data (on heatmaps, where a shaded band would hide the colours)."""
    shape = period_shape(p)
    color = {"stall": "#c62828", "straggler": "#f0a53a", "idle": "#2f6fd6"}.get(p.kind, "#c62828")
    shape.update(fillcolor="rgba(0,0,0,0)", line={"width": 2, "color": color, "dash": "dot"}, layer="above")
    return shape
