"""A job's share of the fabric and the host, for the job page: what it reads (the RDMA ports next to the job's GPUs
and their traffic; the job's cgroup CPU per node) and the two panels it draws under the GPUs' charts. Each panel
reads with at most two queries whatever the job's size: the ports' newest readings and their series, the cgroup's
limits and its series.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from dash import dcc, html

from gpulens.dashboard import ids
from gpulens.dashboard.components import GRAPH_CONFIG, graph_panel, panel
from gpulens.dashboard.fabric import (
    NO_PORTS,
    TRAFFIC_FIELDS,
    NodeTraffic,
    Unavailable,
    available,
    gbit_text,
    job_nics,
    node_traffic,
)
from gpulens.dashboard.figures.fabric import job_fabric_heatmap
from gpulens.dashboard.figures.periods import Period
from gpulens.dashboard.figures.style import empty_figure, palette_color
from gpulens.dashboard.figures.timeseries import Axis, Line, time_series
from gpulens.dashboard.formatting import rate_text
from gpulens.fabricmodel import JobHostReading, NicReading
from gpulens.storage.reading import StoreReader
from gpulens.storage.records import GpuInfo, SeriesData

POINT_BUDGET: Final = 60_000  # series points per panel, shared by the job's ports or nodes
CORES: Final = Axis(ticksuffix=" cores", hoverformat=".2f")
NO_CGROUP: Final = "no cgroup data for this job (the exporter reads no job cgroups here)"
LEGEND_NODES: Final = 12  # more nodes than this: no legend (hover names them)


@dataclass(frozen=True, slots=True)
class JobHost:
    """What the job page read of the job's fabric and host (each part :class:`Unavailable` where the store cannot)."""

    nics: list[NicReading] | Unavailable  # the ports next to the job's GPUs
    traffic: list[NodeTraffic] | Unavailable
    limits: list[JobHostReading] | Unavailable  # the job's newest cgroup reading per node
    cpu: dict[str, SeriesData] | Unavailable  # cpu_used_cores by node
    ports: list[NicReading] | Unavailable  # every port read of the job's nodes (the bandwidth panel's ceiling)


def _points(count: int) -> int:
    return max(60, min(600, POINT_BUDGET // max(1, count)))


# A job on up to this many nodes reads its nodes' ports node by node; a wider one reads every port once (over
# Prometheus every port of 1,000 nodes is ~136,000 series: a two-node job must not pay for them).
PER_NODE_READS_MAX = 16


def _latest_nics(store: StoreReader, placement: Mapping[str, set[int]]) -> list[NicReading]:
    if len(placement) > PER_NODE_READS_MAX:
        return store.latest_nics()
    return [nic for node in sorted(placement) for nic in store.latest_nics(node=node)]


def read_job_host(store: StoreReader, job_id: str, gpus: Sequence[GpuInfo], start: float, end: float) -> JobHost:
    """The job's ports and their traffic (the ports' newest readings of its nodes, one query per node up to
    ``PER_NODE_READS_MAX`` nodes; their series, one query) and its cgroup CPU (its newest cgroup readings, one
    query; their series, one query)."""
    placement: dict[str, set[int]] = defaultdict(set)
    for g in gpus:
        placement[g.node].add(g.gpu)
    latest = available(lambda: _latest_nics(store, placement))
    mine: list[NicReading] | Unavailable = latest if isinstance(latest, Unavailable) else job_nics(latest, placement)
    traffic: list[NodeTraffic] | Unavailable = []
    if isinstance(mine, Unavailable):
        traffic = mine
    elif mine:
        ids_ = [n.id for n in mine]
        series = available(lambda: store.nic_series(ids_, TRAFFIC_FIELDS, start, end, _points(len(ids_))))
        traffic = series if isinstance(series, Unavailable) else node_traffic(mine, series)
    limits = available(lambda: store.latest_job_hosts(job_id=job_id))
    cpu: dict[str, SeriesData] | Unavailable = {}
    if isinstance(limits, Unavailable):
        cpu = limits
    elif limits:
        cpu = available(lambda: store.job_host_series(job_id, ["cpu_used_cores"], start, end, _points(len(placement))))
    return JobHost(mine, traffic, limits, cpu, latest)


def fabric_figure(host: JobHost, *, start: float, end: float, bins: int, periods: Sequence[Period]) -> object:
    """The job's traffic per node against its ports' rate, or why there is none to draw."""
    if isinstance(host.traffic, Unavailable):
        return empty_figure(f"fabric: {host.traffic.reason}", 180)
    if isinstance(host.nics, Unavailable):
        return empty_figure(f"fabric: {host.nics.reason}", 180)
    if not host.nics:
        return empty_figure(NO_PORTS, 180)
    return job_fabric_heatmap(host.traffic, start=start, end=end, bins=bins, periods=periods)


def cpu_figure(host: JobHost, *, start: float, end: float, periods: Sequence[Period]) -> object:
    """The job's cgroup CPU per node in cores used, each node's limit dashed (once when the nodes share it)."""
    if isinstance(host.limits, Unavailable):
        return empty_figure(f"host CPU: {host.limits.reason}", 180)
    if isinstance(host.cpu, Unavailable):
        return empty_figure(f"host CPU: {host.cpu.reason}", 180)
    if not host.limits:
        return empty_figure(NO_CGROUP, 180)
    limit_of = {r.node: r.cpu_limit_cores for r in host.limits}
    nodes = sorted(host.cpu, key=lambda n: (n not in limit_of, n))
    lines: list[Line] = []
    for i, node in enumerate(nodes):
        data = host.cpu[node]
        color = palette_color(i)
        lines.append(Line(node, data.timestamps, data.values.get("cpu_used_cores", ()), color=color, group=node))
    limits = {v for v in limit_of.values() if v is not None}
    if len(limits) == 1:
        (value,) = limits
        lines.append(Line(f"limit {value:g} cores", (start, end), (value, value), color="#c62828", dash="dash"))
    else:
        for i, node in enumerate(nodes):
            lim = limit_of.get(node)
            if lim is not None:
                lines.append(
                    Line(f"{node} limit", (start, end), (lim, lim), color=palette_color(i), dash="dash", group=node)
                )
    return time_series(
        lines,
        CORES,
        start=start,
        end=end,
        periods=periods,
        height=220,
        legend=len(nodes) <= LEGEND_NODES,
        empty="no cgroup CPU reading in this range",
    )


def ports_text(host: JobHost) -> str:
    """The job's ports in a line: how many, their rate together, the ones down now."""
    if isinstance(host.nics, Unavailable) or not host.nics:
        return ""
    rate = sum(n.rate_bytes_per_second or 0.0 for n in host.nics)
    down = [f"{n.node} {n.device}" for n in host.nics if not n.up]
    nodes = len({n.node for n in host.nics})
    text = f"{len(host.nics)} ports on {nodes} node(s), {gbit_text(rate)} ({rate_text(rate)}) together"
    return text + (f" · down now: {', '.join(down)}" if down else "")


def job_host_panels(
    host: JobHost | None, *, start: float, end: float, bins: int, periods: Sequence[Period] = ()
) -> list[html.Div]:
    """The job page's fabric and host CPU panels."""
    if host is None:
        return []
    return [
        panel(
            "Fabric traffic of each node (the RDMA ports next to the job's GPUs, busier direction, of their rate)",
            html.Div(ports_text(host), className="gl-hint"),
            dcc.Graph(
                id=ids.JOB_FABRIC_CHART,
                figure=fabric_figure(host, start=start, end=end, bins=bins, periods=periods),
                config=GRAPH_CONFIG,
            ),
        ),
        graph_panel(
            ids.JOB_HOST_CPU,
            "Host CPU of the job on each node (its cgroup: cores used, against its limit)",
            cpu_figure(host, start=start, end=end, periods=periods),
        ),
    ]
