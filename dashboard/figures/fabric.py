"""Fabric figures: a node's RDMA ports placed beside the GPUs they sit next to (for the interconnect page's node
topology), and the job page's node x time chart of the job's fabric traffic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

import plotly.graph_objects as go

from gpulens.dashboard.fabric import NodeTraffic, gbit_text, gpus_text
from gpulens.dashboard.figures.gputime import Row, gpu_time_heatmap
from gpulens.dashboard.figures.periods import Period
from gpulens.dashboard.figures.style import (
    DOWN_COLOR,
    LINK_COLORS,
    LINK_TEXT_COLORS,
    STALE_COLOR,
    VALIDATE,
    link_state,
)
from gpulens.dashboard.formatting import percent_text, plotly_text, rate_text
from gpulens.dashboard.heatmaps import Metric
from gpulens.fabricmodel import NicReading
from gpulens.ratios import busiest_direction, share
from gpulens.storage.portproblems import best_links, shortfall

NIC_RADIUS: Final = 1.75  # GPUs sit on the unit circle, their ports outside it
SPREAD: Final = 0.16  # radians between ports next to the same GPUs
CORNER: Final = 1.95  # where ports next to no GPU go: the bottom corners
FABRIC_LOAD: Final = Metric(
    "fabric", "Fabric (of the ports' rate)", lambda r: None, percent_text, 0, 1, "Viridis", ((0.0, "0%"),)
)


def nic_load(n: NicReading) -> float | None:
    """The port's busier direction as a share of its rate (None when down or unknown)."""
    if not n.up:
        return None
    return share(busiest_direction(n.transmit_bytes_per_second, n.receive_bytes_per_second), n.rate_bytes_per_second)


def nic_positions(nics: Sequence[NicReading], gpu_angles: Mapping[int, float]) -> list[tuple[NicReading, float, float]]:
    """Where each port goes: outside the mean angle of its GPUs (ports sharing GPUs fanned out); ports next to no
    GPU (or with no affinity known) in the bottom corners, right then left, stacking upwards."""
    placed: list[tuple[NicReading, float, float]] = []
    groups: dict[float, list[NicReading]] = {}
    loose: list[NicReading] = []
    for n in nics:
        angles = [gpu_angles[g] for g in n.gpus if g in gpu_angles]
        if not angles:
            loose.append(n)
            continue
        mean = math.atan2(sum(math.sin(a) for a in angles), sum(math.cos(a) for a in angles))
        groups.setdefault(round(mean, 3), []).append(n)
    for angle, members in groups.items():
        for i, n in enumerate(members):
            a = angle + (i - (len(members) - 1) / 2) * SPREAD
            placed.append((n, NIC_RADIUS * math.cos(a), NIC_RADIUS * math.sin(a)))
    for i, n in enumerate(loose):
        side = 1 if i % 2 == 0 else -1
        placed.append((n, side * CORNER, -CORNER + 0.55 * (i // 2)))
    return placed


def nic_traces(nics: Sequence[NicReading], gpu_xy: Mapping[int, tuple[float, float]]) -> list[Any]:
    """The ports as circles coloured by state (``style.link_state``: green healthy, pale idle, amber degraded, red
    down, grey unknown) and labelled with their load, each joined by a dotted PCIe line to the GPUs it sits next to,
    hovering its state, rate, traffic and GPUs."""
    angles = {g: math.atan2(y, x) for g, (x, y) in gpu_xy.items()}
    placed = nic_positions(nics, angles)
    traces: list[Any] = []
    for n, x, y in placed:
        for g in n.gpus:
            if g in gpu_xy:
                gx, gy = gpu_xy[g]
                traces.append(
                    go.Scatter(
                        x=[x, gx],
                        y=[y, gy],
                        mode="lines",
                        line={"width": 1.4, "color": DOWN_COLOR if not n.up else STALE_COLOR, "dash": "dot"},
                        hoverinfo="skip",
                        **VALIDATE,
                    )
                )
    labels, hovers, colors, inks = [], [], [], []
    best = best_links(nics)
    for n, _, _ in placed:
        load = nic_load(n)
        short = shortfall(n, best.get((n.node, n.link_layer), (0.0, 0))) if n.up else None
        state = link_state(n.up, short is not None, load)
        word = "down" if not n.up else percent_text(load) + ("" if state in ("healthy", "unknown") else f" {state}")
        labels.append(f"<b>{plotly_text(n.device)}</b><br>{word}")
        colors.append(LINK_COLORS[state])
        inks.append(LINK_TEXT_COLORS.get(state, "#ffffff"))
        layer = plotly_text("RoCE" if n.is_roce else (n.link_layer or "?"))
        hovers.append(
            "<br>".join(
                [
                    f"<b>{plotly_text(f'{n.node} {n.device} port {n.port}')}</b> ({layer})",
                    plotly_text(f"state {n.state or '?'} / {n.phys_state or '?'}"),
                    f"rate {gbit_text(n.rate_bytes_per_second)}"
                    + (plotly_text(f" ({n.link_width}X {n.link_speed or ''})".rstrip()) if n.link_width else ""),
                    f"TX {rate_text(n.transmit_bytes_per_second)} · RX {rate_text(n.receive_bytes_per_second)}",
                    f"next to GPUs {gpus_text(n.gpus)}" if n.gpus else "next to no GPU",
                ]
            )
        )
    if placed:
        traces.append(
            go.Scatter(
                x=[x for _, x, _ in placed],
                y=[y for _, _, y in placed],
                mode="markers+text",
                text=labels,
                textposition="middle center",
                textfont={"color": inks, "size": 9},
                marker={"size": 46, "color": colors, "symbol": "circle", "line": {"width": 0}},
                hovertext=hovers,
                hoverinfo="text",
                name="NICs",
                **VALIDATE,
            )
        )
    return traces


def job_fabric_heatmap(
    traffic: Sequence[NodeTraffic], *, start: float, end: float, bins: int, periods: Sequence[Period] = ()
) -> go.Figure:
    """Nodes (rows) x time: the job's traffic on each node's ports next to its GPUs, busier direction, as a share of
    the ports' summed rate (the scale tops out at the busiest value shown, at least 5 %)."""
    rows = [Row(f"{t.node} ({len(t.ports)} NICs)", t.times, t.load) for t in traffic]
    return gpu_time_heatmap(rows, FABRIC_LOAD, start=start, end=end, bins=bins, periods=periods, autoscale=True)
