"""The fabric as the pages read it: each RDMA port's problems (down, degraded, errors, saturated) in the order that
puts problems first, a node's fabric in one line, and a job's fabric traffic and host CPU per node, from the
store's NIC and host records (``gpulens.storage.reading``: ``latest_nics``, ``nic_series``, ``latest_job_hosts``,
``job_host_series``). Pure but for :func:`error_rates`, which makes the one bounded query a panel's error rates take.

Gaps are kept honest: a store that cannot give the fabric is :class:`Unavailable` (said as "not available on this
backend"), a store with no port at all is :data:`NO_PORTS`; neither is ever drawn as zero.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

from gpulens.alerts.state import AlertState
from gpulens.dashboard.grid import natural_key
from gpulens.fabricmodel import NicReading, nic_id, parse_nic_id
from gpulens.model import GpuReading
from gpulens.ratios import busiest_direction, share
from gpulens.storage.portproblems import (
    ERROR_FIELDS,
    ERROR_POINTS,
    PORT_PROBLEMS,
    PROBLEM_FIELDS,
    SATURATED_AT,
    best_links,
    error_rates,
    loads,
    shortfall,
)
from gpulens.storage.reading import NOT_AVAILABLE, NotAvailableOnBackend
from gpulens.storage.records import SeriesData

__all__ = ["ERROR_FIELDS", "ERROR_POINTS", "SATURATED_AT", "error_rates"]  # (theirs, kept here for the pages)

T = TypeVar("T")

NO_PORTS: Final = "no fabric data (the exporter reads no RDMA ports)"
TRAFFIC_FIELDS: Final = ("transmit_bytes_per_second", "receive_bytes_per_second", "rate_bytes_per_second")
# The port fields a port's status reads (``port_statuses``, ``error_rates``): what the pages ask ``latest_nics`` for.
STATUS_FIELDS: Final = PROBLEM_FIELDS
# Problems in the order a table lists them (the first a port has decides its place). A stale port is one whose
# node has not reported for a while: its last state is shown, but not as now.
PROBLEMS: Final = (*PORT_PROBLEMS, "stale")
# The alert engine's rules about a port (labels node, device, port): shown beside what the page derives itself.
FABRIC_RULES: Final = frozenset(
    {"IbLinkDown", "IbLinkFlapping", "IbLinkDegraded", "IbErrors", "FabricCongestion", "FabricBandwidthSaturated"}
)


@dataclass(frozen=True, slots=True)
class Unavailable:
    """The store cannot give this part of the fabric; ``reason`` says so in the page's words."""

    reason: str = NOT_AVAILABLE


def available(call: Callable[[], T]) -> T | Unavailable:
    """``call()``, or :class:`Unavailable` where the backend raises ``NotAvailableOnBackend``."""
    try:
        return call()
    except NotAvailableOnBackend:
        return Unavailable()


@dataclass(frozen=True, slots=True)
class PortStatus:
    """One port as the tables show it: its reading, what is wrong with it, its load and its error rate."""

    nic: NicReading
    problems: tuple[str, ...]  # of PROBLEMS, in that order
    tx_ratio: float | None  # transmit traffic of the port's rate
    rx_ratio: float | None
    error_rate: float | None  # error counts per second over the range (None: not counted by this port)
    degraded_detail: str = ""  # "200 Gb/s of 400 Gb/s" when degraded
    alerts: tuple[str, ...] = ()  # the alert engine's fabric rules firing on this port

    @property
    def load(self) -> float | None:
        return busiest_direction(self.tx_ratio, self.rx_ratio)


def gbit_text(rate_bytes_per_second: float | None) -> str:
    """A port's rate as network datasheets write it: ``400 Gb/s``."""
    if rate_bytes_per_second is None:
        return "\u2013"
    gbit = rate_bytes_per_second * 8 / 1e9
    return f"{gbit:.0f} Gb/s" if gbit >= 10 else f"{gbit:.3g} Gb/s"


def gpus_text(gpus: Sequence[int]) -> str:
    """GPU indices as ranges: ``0-3,6``."""
    if not gpus:
        return ""
    ordered = sorted(set(gpus))
    parts, first, last = [], ordered[0], ordered[0]
    for g in [*ordered[1:], None]:
        if g is not None and g == last + 1:
            last = g
            continue
        parts.append(str(first) if first == last else f"{first}-{last}")
        if g is not None:
            first = last = g
    return ",".join(parts)


def degraded(nic: NicReading, best: tuple[float, int]) -> str:
    """Why an up port is degraded (``gpulens.storage.portproblems.shortfall``) in words: ``2X of 4X``, ``200 Gb/s of
    400 Gb/s``. Empty when it is not."""
    short = shortfall(nic, best)
    if short is None:
        return ""
    what, have, most = short
    return f"{have}X of {most}X" if what == "width" else f"{gbit_text(have)} of {gbit_text(most)}"


def port_statuses(
    nics: Sequence[NicReading],
    error_rates: Mapping[str, float] | None = None,
    firing: Mapping[str, Sequence[str]] | None = None,
    stale_nodes: Collection[str] = (),
) -> list[PortStatus]:
    """Every port with its problems, problems first (down, degraded, errors, saturated), then by node and device.

    ``error_rates``: errors per second over the range by NIC id (:func:`error_rates`); a port absent from it counted
    none in the range if its counters are known. ``firing``: the fabric alerts firing per NIC id. ``stale_nodes``:
    nodes with no recent reading; their ports are only "stale" (no load: their last traffic is not now's)."""
    best = best_links(nics)
    rates = error_rates or {}
    alerts = firing or {}
    out = []
    for n in nics:
        if n.node in stale_nodes:
            out.append(PortStatus(n, ("stale",), None, None, rates.get(n.id), "", tuple(alerts.get(n.id, ()))))
            continue
        tx, rx = loads(n)
        known = any(getattr(n, f) is not None for f in ERROR_FIELDS)
        error_rate = rates.get(n.id, 0.0 if known else None)
        why = degraded(n, best.get((n.node, n.link_layer), (0.0, 0)))
        found = {
            "down": not n.up,
            "degraded": bool(why),
            "errors": bool(error_rate),
            "saturated": max(tx or 0.0, rx or 0.0) >= SATURATED_AT,
        }
        problems = tuple(p for p in PROBLEMS if found.get(p))
        out.append(PortStatus(n, problems, tx, rx, error_rate, why, tuple(alerts.get(n.id, ()))))
    out.sort(key=_order)
    return out


def _order(s: PortStatus) -> tuple[object, ...]:
    return _rank(s.problems, s.alerts, s.nic.node, s.nic.device, s.nic.port)


def _rank(problems: Sequence[str], alerts: Sequence[str], node: str, device: str, port: int) -> tuple[object, ...]:
    rank = PROBLEMS.index(problems[0]) if problems else (len(PROBLEMS) - 1 if alerts else len(PROBLEMS))
    return (rank, natural_key(node), natural_key(device), port)


def ranked_ports(
    problems: Mapping[str, Sequence[str]],
    firing: Mapping[str, Sequence[str]] | None = None,
    stale_nodes: Collection[str] = (),
) -> list[str]:
    """The ports of ``problems`` (``StoreReader.nic_problems``: every port's problems by nic id) in the order
    :func:`port_statuses` lists them (a stale node's ports are only "stale"), without reading their fields."""
    keyed = []
    for nic, found in problems.items():
        key = parse_nic_id(nic)
        if key is None:
            continue
        node, device, port = key
        mine = ("stale",) if node in stale_nodes else found
        keyed.append((_rank(mine, (firing or {}).get(nic, ()), node, device, port), nic))
    keyed.sort()
    return [nic for _, nic in keyed]


def newest_by_node(readings: Iterable[GpuReading]) -> dict[str, float]:
    """Each node's newest GPU sample time."""
    newest: dict[str, float] = {}
    for r in readings:
        if r.timestamp > newest.get(r.node, -math.inf):
            newest[r.node] = r.timestamp
    return newest


def stale_of(newest: Mapping[str, float], now: float, stale_after_s: float) -> set[str]:
    """The nodes none of whose GPUs has reported within ``stale_after_s`` (their exporter is down or behind), from
    each node's newest GPU sample time."""
    return {node for node, at in newest.items() if now - at > stale_after_s}


def stale_nodes(readings: Iterable[GpuReading], now: float, stale_after_s: float) -> set[str]:
    """``stale_of`` the readings' nodes."""
    return stale_of(newest_by_node(readings), now, stale_after_s)


def firing_on_ports(active: Iterable[AlertState]) -> dict[str, list[str]]:
    """The fabric rules firing, by the NIC id their labels name (node, device, port)."""
    out: dict[str, list[str]] = defaultdict(list)
    for a in active:
        rule = a.rule
        if a.state != "firing" or rule not in FABRIC_RULES:
            continue
        node, device, port = a.labels.get("node"), a.labels.get("device"), a.labels.get("port")
        if node and device and port and port.isdigit():
            key = nic_id(node, device, int(port))
            if rule not in out[key]:
                out[key].append(rule)
    return dict(out)


@dataclass(frozen=True, slots=True)
class NodeFabric:
    """One node's fabric in a line: ports up of all, the busiest port's load, whether any port counts errors, and
    whether it is stale (no recent reading: the counts are its last ones)."""

    node: str
    up: int
    total: int
    worst_load: float | None
    errors: bool
    problems: tuple[str, ...]  # of PROBLEMS, over its ports

    @property
    def stale(self) -> bool:
        return "stale" in self.problems


def node_fabric(statuses: Sequence[PortStatus]) -> dict[str, NodeFabric]:
    """Per node, its fabric summary (only nodes with ports: the others have no fabric data)."""
    by_node: dict[str, list[PortStatus]] = defaultdict(list)
    for s in statuses:
        by_node[s.nic.node].append(s)
    out = {}
    for node, ports in by_node.items():
        loads = [s.load for s in ports if s.load is not None]
        seen = {p for s in ports for p in s.problems}
        out[node] = NodeFabric(
            node,
            up=sum(1 for s in ports if s.nic.up),
            total=len(ports),
            worst_load=max(loads) if loads else None,
            errors="errors" in seen or any("IbErrors" in s.alerts for s in ports),
            problems=tuple(p for p in PROBLEMS if p in seen),
        )
    return out


# --- a job's share of the fabric and the host -------------------------------------------------------------------------


def job_nics(nics: Iterable[NicReading], gpus: Mapping[str, set[int]]) -> list[NicReading]:
    """The ports a job's traffic leaves by: on each of its nodes, the ports next to its GPUs there. On a node whose
    ports name no GPU (affinity unknown), all of the node's ports."""
    by_node: dict[str, list[NicReading]] = defaultdict(list)
    for n in nics:
        if n.node in gpus:
            by_node[n.node].append(n)
    out = []
    for node, ports in by_node.items():
        if any(n.gpus for n in ports):
            out += [n for n in ports if gpus[node].intersection(n.gpus)]
        else:
            out += ports
    return sorted(out, key=lambda n: (natural_key(n.node), natural_key(n.device), n.port))


@dataclass(frozen=True, slots=True)
class NodeTraffic:
    """A job's fabric traffic on one node: the sum over its ports per time, and the ports' summed rate."""

    node: str
    ports: tuple[str, ...]  # device names
    times: tuple[float, ...]
    transmit: tuple[float | None, ...]  # bytes per second
    receive: tuple[float | None, ...]
    rate: tuple[float | None, ...]  # the ports' summed rate, bytes per second

    @property
    def load(self) -> list[float | None]:
        """The busier direction of the ports' summed rate, per time."""
        directions = zip(self.transmit, self.receive, self.rate, strict=True)
        return [share(busiest_direction(t, r), c) for t, r, c in directions]


def node_traffic(nics: Sequence[NicReading], series: Mapping[str, SeriesData]) -> list[NodeTraffic]:
    """Per node (by name), the sums of its ports' transmit, receive and rate series per bucket (a port's missing
    rate is its latest one; a bucket where no port reported stays a gap)."""
    sums: dict[str, dict[float, list[float]]] = defaultdict(dict)
    ports: dict[str, list[str]] = defaultdict(list)
    for n in nics:
        ports[n.node].append(n.device)
        data = series.get(n.id)
        if data is None:
            continue
        v = data.values
        columns = [v.get(f, ()) or (None,) * len(data.timestamps) for f in TRAFFIC_FIELDS]
        for i, t in enumerate(data.timestamps):
            tx, rx, rate = (c[i] for c in columns)
            if tx is None and rx is None:
                continue
            acc = sums[n.node].setdefault(t, [0.0, 0.0, 0.0])
            acc[0] += tx or 0.0
            acc[1] += rx or 0.0
            acc[2] += rate if rate is not None else (n.rate_bytes_per_second or 0.0)
    out = []
    for node in sorted(ports, key=natural_key):
        points = sorted(sums.get(node, {}).items())
        out.append(
            NodeTraffic(
                node,
                tuple(ports[node]),
                tuple(t for t, _ in points),
                tuple(p[0] for _, p in points),
                tuple(p[1] for _, p in points),
                tuple(p[2] or None for _, p in points),
            )
        )
    return out
