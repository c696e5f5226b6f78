"""The fabric and host side of the alert history: each RDMA port's, node's and job's host readings over the window.

``FabricWindow.add`` takes one round's snapshots (their ``nics``, ``host`` and ``job_hosts``); ``History`` feeds it
and expires it with the GPU rounds. Beside the readings of the last ``window_s`` seconds it keeps, per port, what
outlives the window: when it was last seen up and since when it is down (``PortMemory``), the highest rate and
width it has run at, and its *reference*: the transmit-wait and CNP rates of its recent rounds that were not far
above its usual level, kept for ``window_s`` back from the newest such round, so congestion that lasts longer than
the window still has a baseline. It also maps each port to the jobs holding its GPUs (``port_jobs``).

Everything the history keeps of one port lives in one ``PortState``, and ``ports`` pairs each of the round's readings
with it: a rule reads a port's series, memory and reference without building its key or looking it up (8,000 ports a
round at 1,000 nodes, each read by six rules).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass
from operator import attrgetter
from typing import Final, TypeVar

from gpulens.alerts.jobround import _sorted_median
from gpulens.fabricmodel import HostReading, JobHostReading, NicReading
from gpulens.model import NodeSnapshot

PortKey = tuple[str, str, int]  # (node, device, port)
K = TypeVar("K")
V = TypeVar("V")

# A round joins a port's reference while the reference holds fewer than REFERENCE_SETTLED_ROUNDS rounds, or while
# its wait (or CNP) rate is at most REFERENCE_FIT_RATIO times the reference's median (or below the floor the rule
# gives): a congested round is not a baseline.
REFERENCE_SETTLED_ROUNDS: Final = 6
REFERENCE_FIT_RATIO: Final = 3.0


@dataclass(slots=True)
class PortMemory:
    """What the history remembers of one port beyond the window."""

    last_up: float | None = None  # the latest round in which it was up
    down_since: float | None = None  # the first round of its current down spell, after it had been up
    best_rate: float | None = None  # the highest rate it ran at while up (bytes/s)
    best_width: int | None = None  # the most lanes it ran with while up
    seen: float = 0.0  # the latest round that read it


_isfinite: Final = math.isfinite


class _Reference:
    """A port's recent usual level of one rate (wait ticks or CNPs per second).

    Whether a round fits is judged against a median refreshed every REFERENCE_SETTLED_ROUNDS rounds; ``median``
    itself is always current. The values are kept in arrival order only, and a median sorts them when asked: at most
    once every REFERENCE_SETTLED_ROUNDS rounds per port, or for a port over a congestion floor. Keeping a sorted copy
    beside them (an insertion and a removal in a list of ~180 values each round, for 8,000 ports) cost more than
    those sorts, and twice the memory.
    """

    __slots__ = ("age", "times", "usual", "values")

    def __init__(self) -> None:
        self.times: deque[float] = deque()  # round times, oldest first
        self.values: deque[float] = deque()  # the value of each of those rounds
        self.usual: float | None = None
        self.age = 0

    def median(self) -> float | None:
        return _sorted_median(sorted(self.values))

    def settled(self) -> bool:
        return len(self.values) >= REFERENCE_SETTLED_ROUNDS

    def note(self, now: float, value: float | None, window_s: float) -> None:
        if value is None or not _isfinite(value):
            return
        times, values = self.times, self.values
        if value > 1.0 and len(values) >= REFERENCE_SETTLED_ROUNDS:
            if self.usual is None or self.age >= REFERENCE_SETTLED_ROUNDS:
                self.usual, self.age = _sorted_median(sorted(values)), 0
            if self.usual is not None and value > REFERENCE_FIT_RATIO * self.usual:
                return  # far above the usual level: congestion, not a baseline
        self.age += 1
        times.append(now)
        values.append(value)
        horizon = now - window_s
        while times[0] < horizon:
            times.popleft()
            values.popleft()


def _append(table: dict[K, deque[tuple[float, V]]], key: K, entry: tuple[float, V], horizon: float) -> None:
    """Append ``entry`` to ``key``'s series, and drop its entries older than ``horizon``."""
    series = table.get(key)
    if series is None:
        series = table[key] = deque()
    series.append(entry)
    while series[0][0] < horizon:
        series.popleft()


def _expire_series(table: dict[K, deque[tuple[float, V]]], horizon: float, trimmed: Set[K] | None) -> int:
    """Drop the entries older than ``horizon``, and the series left empty, of the series not in ``trimmed`` (those
    already trimmed at ``horizon``; ``None``: none was); the number of series visited."""
    keys = list(table) if trimmed is None else table.keys() - trimmed if len(table) > len(trimmed) else ()
    for key in keys:
        series = table[key]
        if series[-1][0] < horizon:
            del table[key]
            continue
        while series[0][0] < horizon:
            series.popleft()
    return len(keys)


def _time(entry: tuple[float, object]) -> float:
    return entry[0]


@dataclass(frozen=True, slots=True)
class Baseline:
    """A port's usual transmit-wait and CNP rates (``None`` while too few rounds are known)."""

    wait: float | None
    cnp: float | None


class Peers:
    """The rates of one node's up ports of one link layer in the latest round, sorted, and the largest of them
    (``top``: infinite when one is NaN, since NaNs do not sort and no largest is then known)."""

    __slots__ = ("rates", "top")

    def __init__(self, rate: float) -> None:
        self.rates = [rate]
        self.top = math.inf

    def finish(self) -> None:
        rates = self.rates
        rates.sort()
        self.top = rates[-1] if all(r == r for r in rates) else math.inf


# The port counters the error and flapping rules compare across their window (``ports_moved``)
MOVED_COUNTERS: Final = attrgetter(
    "symbol_errors_total", "local_link_integrity_errors_total", "receive_errors_total", "link_downed_total"
)


class PortState(PortMemory):
    """All the history keeps of one port: its memory (``PortMemory``), its readings of the window
    (``(round time, reading)`` pairs, oldest first), its wait and CNP references, the rates of its node's up ports
    of its link layer (``peers``: set in each round it is up with a rate), and the latest round in which its
    ``MOVED_COUNTERS`` differed from its reading before, or one of them was unknown (``moved``)."""

    __slots__ = ("cnp", "counters", "moved", "peers", "series", "wait")

    def __init__(self) -> None:
        super().__init__()
        self.counters: tuple[int | None, ...] | None = None  # MOVED_COUNTERS of the latest reading
        self.moved = -math.inf
        self.series: deque[tuple[float, NicReading]] = deque()
        self.wait: _Reference | None = None
        self.cnp: _Reference | None = None
        self.peers: Peers | None = None

    def baseline(self) -> Baseline:
        wait, cnp = self.wait, self.cnp
        return Baseline(
            wait.median() if wait is not None and wait.settled() else None,
            cnp.median() if cnp is not None and cnp.settled() else None,
        )


class FabricWindow:
    """Rolling window of each port's, node's and job's host readings, with the per-port memory above."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._ports: dict[PortKey, PortState] = {}
        self._hosts: dict[str, deque[tuple[float, HostReading]]] = {}
        self._job_hosts: dict[tuple[str, str], deque[tuple[float, JobHostReading]]] = {}
        self._latest: list[NicReading] | None = []  # nics, this round (worked out when first asked)
        self._pairs: list[tuple[NicReading, PortState]] = []  # this round's readings with their ports' states
        self._moved: list[tuple[NicReading, PortState]] = []  # ports_moved, this round
        self._trimmed: float | None = None  # the horizon ``add`` trimmed every port at, when it read them all
        self._horizon: float | None = None  # the horizon ``add`` trimmed the hosts and job shares it read at
        self._shares_read: Set[tuple[str, str]] = set()  # the (node, job) shares the latest round read
        self.walked = 0  # host and job share series the latest expiry visited beyond those the round read
        self._snapshots: Sequence[NodeSnapshot] = ()
        self._by_node: dict[str, list[NicReading]] | None = {}
        self._rates: dict[tuple[str, str | None], Peers] = {}  # up ports' rates by node and link layer
        self._peer_rates: dict[tuple[str, str | None, float | None], float | None] = {}  # peer_rate, this round
        self._port_jobs: dict[PortKey, tuple[str, ...]] = {}  # port_jobs of this round, as asked
        self._latest_hosts: dict[str, HostReading] = {}
        self._latest_job_hosts: dict[str, list[JobHostReading]] = {}
        self._gpu_jobs: dict[tuple[str, int], set[str]] | None = {}  # this round's jobs of each (node, GPU index)
        self._job_nodes: dict[str, frozenset[str]] | None = {}

    # ------------------------------------------------------------------------------------------ adding

    def add(self, now: float, snapshots: Sequence[NodeSnapshot]) -> None:
        """Take one round's snapshots. The ports it reads also lose here the readings ``expire`` would drop at
        ``now - window_s``, as their references do."""
        pairs: list[tuple[NicReading, PortState]] = []
        moved: list[tuple[NicReading, PortState]] = []
        read = 0  # ports read this round (a port read twice counts once)
        rates: dict[tuple[str, str | None], Peers] = {}
        latest_hosts: dict[str, HostReading] = {}
        latest_job_hosts: dict[str, list[JobHostReading]] = {}
        shares_read: set[tuple[str, str]] = set()
        ports, hosts, job_hosts = self._ports, self._hosts, self._job_hosts
        window_s = self.window_s
        horizon = now - window_s
        add_pair, add_moved = pairs.append, moved.append
        for snap in snapshots:
            for nic in snap.nics:
                key = (nic.node, nic.device, nic.port)
                port = ports.get(key)
                if port is None:
                    port = ports[key] = PortState()
                pair = (nic, port)
                add_pair(pair)
                series = port.series
                counters = MOVED_COUNTERS(nic)
                if None in counters or (series and counters != port.counters):
                    port.moved = now
                port.counters = counters
                series.append((now, nic))
                first = series[0][0]
                if first < horizon:
                    while series[0][0] < horizon:
                        series.popleft()
                    first = series[0][0]
                if port.moved >= first or len(series) < 2:
                    add_moved(pair)  # a counter moved within the window, or the window has no two readings
                # What outlives the window (``PortMemory``), and the references.
                if port.seen != now:
                    read += 1
                    port.seen = now
                if not nic.up:
                    if port.last_up is not None and port.down_since is None:
                        port.down_since = now
                    continue
                port.last_up = now
                port.down_since = None
                rate, width = nic.rate_bytes_per_second, nic.link_width
                if rate:
                    if port.best_rate is None or rate > port.best_rate:
                        port.best_rate = rate
                    group = rates.get((nic.node, nic.link_layer))
                    if group is None:
                        group = rates[(nic.node, nic.link_layer)] = Peers(rate)
                    else:
                        group.rates.append(rate)
                    port.peers = group
                if width and (port.best_width is None or width > port.best_width):
                    port.best_width = width
                value = nic.transmit_wait_per_second
                if value is not None:  # ``reference.note(now, value, window_s)``, inline (8,000 ports a round)
                    reference = port.wait
                    if reference is None:
                        reference = port.wait = _Reference()
                    if value - value == 0:  # finite
                        values = reference.values
                        keep = True
                        if value > 1.0 and len(values) >= REFERENCE_SETTLED_ROUNDS:
                            usual = reference.usual
                            if usual is None or reference.age >= REFERENCE_SETTLED_ROUNDS:
                                usual = reference.usual = _sorted_median(sorted(values))
                                reference.age = 0
                            keep = usual is None or not value > REFERENCE_FIT_RATIO * usual  # else congestion
                        if keep:
                            reference.age += 1
                            times = reference.times
                            times.append(now)
                            values.append(value)
                            if times[0] < horizon:
                                while times[0] < horizon:
                                    times.popleft()
                                    values.popleft()
                value = nic.cnp_handled_per_second
                if value is not None:
                    reference = port.cnp
                    if reference is None:
                        reference = port.cnp = _Reference()
                    reference.note(now, value, window_s)
            if snap.host is not None:
                latest_hosts[snap.node] = snap.host
                _append(hosts, snap.node, (now, snap.host), horizon)
            for share in snap.job_hosts:
                latest_job_hosts.setdefault(share.job_id, []).append(share)
                shares_read.add((share.node, share.job_id))
                _append(job_hosts, (share.node, share.job_id), (now, share), horizon)
        for group in rates.values():
            group.finish()
        self._snapshots = snapshots
        self._latest = None
        self._pairs = pairs
        self._moved = moved
        self._trimmed = horizon if read == len(ports) else None
        self._horizon = horizon
        self._rates = rates
        self._latest_hosts = latest_hosts
        self._latest_job_hosts = latest_job_hosts
        self._shares_read = shares_read
        self._peer_rates = {}
        self._port_jobs = {}
        self._by_node = self._gpu_jobs = self._job_nodes = None  # worked out when first asked

    def _jobs(self) -> tuple[dict[tuple[str, int], set[str]], dict[str, frozenset[str]]]:
        """This round's jobs of each (node, GPU index), and each job's nodes (worked out once a round)."""
        if self._gpu_jobs is None or self._job_nodes is None:
            gpu_jobs: dict[tuple[str, int], set[str]] = {}
            job_nodes: dict[str, set[str]] = {}
            for snap in self._snapshots:
                for job in snap.jobs:
                    gpu_jobs.setdefault((job.node, job.gpu), set()).add(job.job_id)
                    job_nodes.setdefault(job.job_id, set()).add(job.node)
            self._gpu_jobs = gpu_jobs  # port_jobs sorts what it gathers: no per-GPU sort here
            self._job_nodes = {k: frozenset(v) for k, v in job_nodes.items()}
        return self._gpu_jobs, self._job_nodes

    def _nodes(self) -> dict[str, list[NicReading]]:
        """This round's ports by node (worked out once a round)."""
        if self._by_node is None:
            by_node: dict[str, list[NicReading]] = {}
            for nic in self.nics:
                by_node.setdefault(nic.node, []).append(nic)
            self._by_node = by_node
        return self._by_node

    def expire(self, horizon: float) -> None:
        ports = self._ports
        if self._trimmed is None or horizon != self._trimmed:  # else ``add`` read and trimmed every port
            for key in [k for k, port in ports.items() if port.seen < horizon]:
                del ports[key]
            for port in ports.values():
                series = port.series
                while series[0][0] < horizon:  # a port this round did not read (``add`` trims those it read)
                    series.popleft()
        trimmed = horizon == self._horizon  # ``add`` trimmed the hosts and shares it read: the others, here
        self.walked = _expire_series(self._hosts, horizon, self._latest_hosts.keys() if trimmed else None)
        self.walked += _expire_series(self._job_hosts, horizon, self._shares_read if trimmed else None)

    # ------------------------------------------------------------------------------------------ reading

    @property
    def nics(self) -> Sequence[NicReading]:
        """The latest round's ports, in snapshot order."""
        if self._latest is None:
            self._latest = [pair[0] for pair in self._pairs]
        return self._latest

    def ports(self) -> Sequence[tuple[NicReading, PortState]]:
        """The latest round's ports, in snapshot order, each with its ``PortState`` (what the rules iterate)."""
        return self._pairs

    def ports_moved(self) -> Sequence[tuple[NicReading, PortState]]:
        """``ports`` whose ``MOVED_COUNTERS`` may differ between their oldest and newest reading of the window (a
        superset, in the same order): a counter changed from one reading to the next within the window, one was
        unknown, or the window holds fewer than two readings. Every other port's counters are the same at both ends,
        which is where the error and flapping rules find nothing (their own first test)."""
        return self._moved

    def port(self, key: PortKey) -> PortState | None:
        return self._ports.get(key)

    def node_nics(self, node: str) -> Sequence[NicReading]:
        """The latest round's ports of one node."""
        return self._nodes().get(node, ())

    def port_series(self, key: PortKey) -> Sequence[tuple[float, NicReading]]:
        """A port's ``(round time, reading)`` pairs in the window, oldest first."""
        port = self._ports.get(key)
        return port.series if port is not None else ()

    def memory(self, key: PortKey) -> PortMemory:
        return self._ports.get(key) or PortMemory()

    def baseline(self, key: PortKey) -> Baseline:
        port = self._ports.get(key)
        return port.baseline() if port is not None else Baseline(None, None)

    def unchanged(self, key: PortKey, values: Callable[[NicReading], tuple[int | None, ...]]) -> bool:
        """Whether counters (``values`` reads several at once) are all known and the same in the port's oldest and
        newest reading of the window: then none of them rose in any part of it (``increase`` is 0 for each)."""
        port = self._ports.get(key)
        if port is None or len(port.series) < 2:
            return False
        series = port.series
        first = values(series[0][1])
        return None not in first and first == values(series[-1][1])

    def increase(self, key: PortKey, since: float, value: Callable[[NicReading], int | None]) -> float | None:
        """How much a port counter rose from its oldest reading at or after ``since`` to the latest (a counter that
        went back counts from zero); ``None`` with fewer than two readings of it."""
        port = self._ports.get(key)
        if port is None:
            return None
        series = port.series
        first, end = value(series[0][1]), value(series[-1][1])
        if first is not None and first == end and len(series) >= 2:
            return 0.0  # unchanged over the whole window: a counter that only rises did not rise in part of it
        i = bisect_left(series, since, key=_time)
        if i >= len(series) - 1:
            return None
        start = value(series[i][1])
        if start is None or end is None:
            return None
        return float(end - start if end >= start else end)

    def down_rounds(self, key: PortKey, since: float) -> int:
        """Up-to-down transitions of the port seen in the rounds at or after ``since``."""
        port = self._ports.get(key)
        series = port.series if port is not None else deque()
        i = bisect_left(series, since, key=_time) if series else 0
        count, was_up = 0, None
        for _, nic in list(series)[max(0, i - 1) :]:
            if was_up and not nic.up:
                count += 1
            was_up = nic.up
        return count

    def port_jobs(self, nic: NicReading) -> tuple[str, ...]:
        """The jobs holding any of the port's GPUs this round."""
        known = self._port_jobs.get(nic.key)
        if known is None:
            gpu_jobs = self._jobs()[0]
            found = {job for gpu in nic.gpus for job in gpu_jobs.get((nic.node, gpu), ())}
            known = self._port_jobs[nic.key] = tuple(sorted(found))
        return known

    def peer_rate(self, nic: NicReading) -> float | None:
        """The median rate of the node's other up ports of the same link layer this round."""
        own = nic.rate_bytes_per_second if nic.up else None
        memo = (nic.node, nic.link_layer, own)  # the ports of a node mostly share one rate: one median for all
        if memo in self._peer_rates:
            return self._peer_rates[memo]
        group = self._rates.get((nic.node, nic.link_layer))
        rates = group.rates if group is not None else []  # sorted once a round, in ``add``
        if own in rates:
            rates = rates.copy()
            rates.remove(own)
        found = self._peer_rates[memo] = _sorted_median(rates)
        return found

    def job_nodes(self, job_id: str) -> frozenset[str]:
        """The nodes the job holds GPUs on this round."""
        return self._jobs()[1].get(job_id, frozenset())

    def job_nics(self, gpus: Mapping[str, Sequence[int]]) -> list[NicReading]:
        """The latest readings of the ports next to the job's GPUs (``gpus``: indices by node)."""
        by_node = self._nodes()
        return [n for node, held in gpus.items() for n in by_node.get(node, ()) if set(n.gpus) & set(held)]

    def host(self, node: str) -> HostReading | None:
        return self._latest_hosts.get(node)

    def hosts(self) -> Sequence[HostReading]:
        """Every node's host reading this round, by node name."""
        return [self._latest_hosts[node] for node in sorted(self._latest_hosts)]

    def all_job_hosts(self) -> list[JobHostReading]:
        """Every job's share of each of its nodes this round."""
        return [share for shares in self._latest_job_hosts.values() for share in shares]

    def host_series(self, node: str) -> Sequence[tuple[float, HostReading]]:
        return self._hosts.get(node, ())

    def job_hosts(self, job_id: str) -> Sequence[JobHostReading]:
        """The job's share of each of its nodes this round."""
        return self._latest_job_hosts.get(job_id, ())
