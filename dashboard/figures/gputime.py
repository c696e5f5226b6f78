"""GPU x time heatmaps: one row per GPU, one column per time bin, so a job of any size reads at a glance (the job
page's utilization, NVLink and power charts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go

from gpulens.dashboard.figures.periods import Period, period_label, period_outline
from gpulens.dashboard.figures.style import VALIDATE, base_layout, colorscale, empty_figure, figure
from gpulens.dashboard.formatting import plotly_text, round_sig
from gpulens.dashboard.heatmaps import Metric


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


def sample_step(rows: Sequence[Row]) -> float | None:
    """The rows' usual time between samples (the median gap), None with fewer than two samples in any row."""
    gaps = sorted(b - a for r in rows for a, b in zip(r.times, r.times[1:], strict=False) if b > a)
    return gaps[len(gaps) // 2] if gaps else None


def fitted_bins(rows: Sequence[Row], start: float, end: float, bins: int) -> int:
    """At most ``bins``, and no more than there are sample steps in [start, end]: a bin narrower than the time
    between samples would hold none every other column (white stripes across a short range)."""
    step = sample_step(rows)
    if step is None or end <= start:
        return bins
    return max(1, min(bins, int((end - start) // step)))


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

    Columns are never narrower than the time between samples (``fitted_bins``), so cells span their samples without
    gaps. With ``autoscale`` the colour scale tops out at the largest value shown (at least 5%), so that traffic far
    below a link's ceiling still shows its changes.
    """
    if not rows or not any(v is not None for r in rows for v in r.values):
        return empty_figure("no data in this range")
    bins = fitted_bins(rows, start, end, bins)
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
        y=[plotly_text(r.label) for r in rows],
        zmin=metric.zmin,
        zmax=zmax,
        colorscale=colorscale(metric.colorscale),
        colorbar=colorbar,
        hovertemplate="%{y}<br>%{x}<br>%{z:.0%}<extra></extra>"
        if metric.ticks
        else "%{y}<br>%{x}<br>%{z}<extra></extra>",
        ygap=1,
        **VALIDATE,
    )
    return figure(
        [trace],
        base_layout(
            height=max(180, 70 + 16 * len(rows)),
            xaxis={"type": "date", "range": [round(start * 1000), round(end * 1000)]},
            yaxis={"autorange": "reversed", "automargin": True, "type": "category"},
            margin={"l": 8, "r": 16, "t": 20, "b": 40},
            shapes=[period_outline(p) for p in periods],
            annotations=[period_label(p) for p in periods],
        ),
    )
