"""Interconnect figures: every GPU's PCIe and NVLink load against its link ceilings, a node's NVLink topology, and
the link-health test they mark (a PCIe link trained below its maximum).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

import plotly.graph_objects as go

from gpulens.dashboard.figures.fabric import nic_traces
from gpulens.dashboard.figures.style import (
    DOWN_COLOR,
    LIMIT_COLOR,
    LINK_COLORS,
    PALETTE,
    STALE_COLOR,
    VALIDATE,
    base_layout,
    colorscale,
    empty_figure,
    figure,
    link_state,
)
from gpulens.dashboard.formatting import gpu_label, percent_text, plotly_text, rate_text, round_sig
from gpulens.dashboard.paths import gpu_path
from gpulens.fabricmodel import NicReading
from gpulens.hardware import nvlink_max_bytes_per_second
from gpulens.model import GpuReading
from gpulens.ratios import LinkLoad, nvlink_utilization_ratio, pcie_utilization_ratio


def pcie_degraded(r: GpuReading) -> bool:
    """The link trained below its maximum generation or width (a classic hardware fault)."""
    gen, gen_max = r.pcie_link_generation, r.pcie_link_generation_max
    width, width_max = r.pcie_link_width, r.pcie_link_width_max
    return bool((gen and gen_max and gen < gen_max) or (width and width_max and width < width_max))


LOAD_BIN: Final = 0.05  # the density's cell: 5% of the link maximum on each axis
LOAD_TOP: Final = 200  # the busiest GPUs drawn as their own (clickable) points


def link_load(loads: Sequence[LinkLoad], *, top: int = LOAD_TOP) -> go.Figure:
    """Every GPU up against its link maximums: its busier PCIe direction (x) and NVLink direction (y) as shares of the
    links' ceilings (``ratios.link_loads``). A density counts every GPU in 5% cells (any cluster size, a few kB); the
    ``top`` busiest GPUs are drawn as points with their names, a click opening the GPU. Saturated links sit at the
    right or top edge; GPUs without NVLink sit at 0 on the y axis.
    """
    if not loads:
        return empty_figure("no PCIe or NVLink readings", 380)
    cells = math.ceil(1 / LOAD_BIN) + 1  # the last cell holds 100% and above
    counts: list[list[int | None]] = [[None] * cells for _ in range(cells)]
    for load in loads:
        x, y = load.pcie_ratio, load.nvlink_ratio
        row, col = min(cells - 1, int(y / LOAD_BIN)), min(cells - 1, int(x / LOAD_BIN))
        counts[row][col] = (counts[row][col] or 0) + 1
    centres = [round((i + 0.5) * LOAD_BIN, 3) for i in range(cells)]
    density = go.Heatmap(
        z=counts,
        x=centres,
        y=centres,
        colorscale=colorscale("Blues"),
        showscale=False,
        hovertemplate="%{z} GPUs at PCIe ~%{x:.0%}, NVLink ~%{y:.0%}<extra></extra>",
        name="all GPUs",
        **VALIDATE,
    )
    busiest = sorted(loads, key=lambda load: (-max(load.pcie_ratio, load.nvlink_ratio), load.node, load.gpu))[:top]
    points = go.Scatter(
        x=[round_sig(b.pcie_ratio, 3) for b in busiest],
        y=[round_sig(b.nvlink_ratio, 3) for b in busiest],
        customdata=[gpu_path(b.uuid) for b in busiest],
        text=[plotly_text(gpu_label(b.node, b.gpu)) for b in busiest],
        mode="markers",
        name=f"the {len(busiest)} busiest GPUs",
        marker={"size": 7, "color": PALETTE[1], "opacity": 0.85, "line": {"width": 0.5, "color": "#ffffff"}},
        hovertemplate="%{text}<br>PCIe %{x:.0%} · NVLink %{y:.0%}<extra></extra>",
        **VALIDATE,
    )
    line = {"color": LIMIT_COLOR, "dash": "dash", "width": 1}
    return figure(
        [density, points],
        base_layout(
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


def node_topology(
    readings: Sequence[GpuReading], down_links: Mapping[str, int] | None = None, nics: Sequence[NicReading] = ()
) -> go.Figure:
    """A node's GPUs around its NVSwitch fabric: an edge per GPU, as wide as its active links and coloured
    by state (``style.link_state``: green carrying traffic, pale idle, amber with links down; red dotted without
    NVLink on an NVLink node). Each GPU shows its PCIe link; a GPU
    that is down, has NVLinks down or a PCIe link below its maximum is red. Click a GPU for its page.

    ``down_links`` counts inactive NVLinks per GPU UUID, where known. ``nics``: the node's RDMA ports, drawn outside
    the GPUs they sit next to (``gpulens.dashboard.figures.fabric``).
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
                state = link_state(True, bool(down.get(r.uuid)), nvlink_utilization_ratio(r))
                traces.append(_edge((0.0, 0.0), (x, y), width, LINK_COLORS[state], None))
            else:
                traces.append(_edge((0.0, 0.0), (x, y), 2, DOWN_COLOR, "dot"))
    traces.extend(nic_traces(nics, {r.gpu: (x, y) for r, x, y in zip(gpus, xs, ys, strict=True)}))
    labels, hovers, colors = [], [], []
    for r in gpus:
        missing = down.get(r.uuid, 0)
        degraded = pcie_degraded(r)
        labels.append(f"<b>GPU {r.gpu}</b><br>Gen{r.pcie_link_generation or '?'} x{r.pcie_link_width or '?'}")
        hover = [f"<b>{plotly_text(gpu_label(r.node, r.gpu))}</b>", plotly_text(r.uuid)]
        if r.nvlink_links_active is not None:
            ceiling = rate_text(nvlink_max_bytes_per_second(r.nvlink_links_active))
            hover.append(f"NVLink {r.nvlink_links_active} links active" + (f", {missing} down" if missing else ""))
            hover.append(f"NVLink load {percent_text(nvlink_utilization_ratio(r))} of {ceiling}")
        hover.append(
            f"PCIe Gen{r.pcie_link_generation or '?'} x{r.pcie_link_width or '?'}"
            f" (max Gen{r.pcie_link_generation_max or '?'} x{r.pcie_link_width_max or '?'})"
            + (" <b>degraded</b>" if degraded else "")
            + f", load {percent_text(pcie_utilization_ratio(r))}"
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
            **VALIDATE,
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
                **VALIDATE,
            )
        )
    reach = 1.45 if not nics else 2.2
    low = -1.3 if not nics else -2.2
    return figure(
        traces,
        base_layout(
            height=380 if not nics else 460,
            xaxis={"visible": False, "range": [-reach, reach], "fixedrange": True},
            yaxis={"visible": False, "range": [low, -low], "scaleanchor": "x", "fixedrange": True},
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
        **VALIDATE,
    )
