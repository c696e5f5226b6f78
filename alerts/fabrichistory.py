"""The fabric and host side of the alert history: each RDMA port's, node's and job's host readings over the window.

``FabricWindow.add`` takes one round's snapshots (their ``nics``, ``host`` and ``job_hosts``); ``History`` feeds it
and expires it with the GPU rounds. Beside the readings of the last ``window_s`` seconds it keeps, per port, what
outlives the window: when it was last seen up and since when it is down (``PortMemory``), the highest rate and
width it has run at, and its *reference*: the transmit-wait and CNP rates of its recent rounds that were not far
above its usual level, kept for ``window_s`` back from the newest such round, so congestion that lasts longer than
the window still has a baseline. It also maps each port to the jobs holding its GPUs (``port_jobs``).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

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


def _sorted_median(ordered: Sequence[float]) -> float | None:
    """The median of values already sorted (``statistics.median``'s answer, without sorting them again)."""
    n = len(ordered)
    if not n:
        return None
    middle = n // 2
    return ordered[middle] if n % 2 else (ordered[middle - 1] + ordered[middle]) / 2


class _Reference:
    """A port's recent usual level of one rate (wait ticks or CNPs per second).

    Whether a round fits is judged against a median refreshed every REFERENCE_SETTLED_ROUNDS rounds; ``median``
    itself is always current. The values are kept sorted beside their arrival order, so a median is a lookup, not
    a sort of the window's values (8,000 ports' baselines a round: sorting them cost more than all the port rules).
    """

    __slots__ = ("age", "ordered", "usual", "values")

    def __init__(self) -> None:
        self.values: deque[tuple[float, float]] = deque()  # (round time, value), oldest first
        self.ordered: list[float] = []  # the same values, sorted
        self.usual: float | None = None
        self.age = 0

    def median(self) -> float | None:
        return _sorted_median(self.ordered)

    def settled(self) -> bool:
        return len(self.values) >= REFERENCE_SETTLED_ROUNDS

    def note(self, now: float, value: float | None, window_s: float) -> None:
        if value is None or not math.isfinite(value):
            return
        if value > 1.0 and self.settled():
            if self.usual is None or self.age >= REFERENCE_SETTLED_ROUNDS:
                self.usual, self.age = self.median(), 0
            if self.usual is not None and value > REFERENCE_FIT_RATIO * self.usual:
                return  # far above the usual level: congestion, not a baseline
        self.age += 1
        self.values.append((now, value))
        bisect.insort(self.ordered, value)
        while self.values[0][0] < now - window_s:
            _, old = self.values.popleft()
            del self.ordered[bisect.bisect_left(self.ordered, old)]


def _expire_series(table: dict[K, deque[tuple[float, V]]], horizon: float) -> None:
    for key in [k for k, series in table.items() if series[-1][0] < horizon]:
        del table[key]
    for series in table.values():
        while series[0][0] < horizon:
            series.popleft()


@dataclass(frozen=True, slots=True)
class Baseline:
    """A port's usual transmit-wait and CNP rates (``None`` while too few rounds are known)."""

    wait: float | None
    cnp: float | None


class FabricWindow:
    """Rolling window of each port's, node's and job's host readings, with the per-port memory above."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._ports: dict[PortKey, deque[tuple[float, NicReading]]] = {}
        self._hosts: dict[str, deque[tuple[float, HostReading]]] = {}
        self._job_hosts: dict[tuple[str, str], deque[tuple[float, JobHostReading]]] = {}
        self._memory: dict[PortKey, PortMemory] = {}
        self._wait: dict[PortKey, _Reference] = {}
        self._cnp: dict[PortKey, _Reference] = {}
        self._latest: list[NicReading] = []
        self._by_node: dict[str, list[NicReading]] = {}
        self._rates: dict[tuple[str, str | None], list[float]] = {}  # up ports' rates by node and link layer
        self._port_jobs: dict[PortKey, tuple[str, ...]] = {}  # port_jobs of this round, as asked
        self._latest_hosts: dict[str, HostReading] = {}
        self._latest_job_hosts: dict[str, list[JobHostReading]] = {}
        self._gpu_jobs: dict[tuple[str, int], set[str]] = {}  # this round's jobs of each (node, GPU index)
        self._job_nodes: dict[str, frozenset[str]] = {}

    # ------------------------------------------------------------------------------------------ adding

    def add(self, now: float, snapshots: Sequence[NodeSnapshot]) -> None:
        latest: list[NicReading] = []
        gpu_jobs: dict[tuple[str, int], set[str]] = {}
        job_nodes: dict[str, set[str]] = {}
        self._latest_hosts = {}
        self._latest_job_hosts = {}
        for snap in snapshots:
            for job in snap.jobs:
                gpu_jobs.setdefault((job.node, job.gpu), set()).add(job.job_id)
                job_nodes.setdefault(job.job_id, set()).add(job.node)
            for nic in snap.nics:
                latest.append(nic)
                key = nic.key
                series = self._ports.get(key)
                if series is None:
                    series = self._ports[key] = deque()
                series.append((now, nic))
                self._remember(now, key, nic)
            if snap.host is not None:
                self._latest_hosts[snap.node] = snap.host
                self._hosts.setdefault(snap.node, deque()).append((now, snap.host))
            for share in snap.job_hosts:
                self._latest_job_hosts.setdefault(share.job_id, []).append(share)
                self._job_hosts.setdefault((share.node, share.job_id), deque()).append((now, share))
        self._latest = latest
        self._by_node = {}
        self._rates = {}
        for nic in latest:
            self._by_node.setdefault(nic.node, []).append(nic)
            if nic.up and nic.rate_bytes_per_second:
                self._rates.setdefault((nic.node, nic.link_layer), []).append(nic.rate_bytes_per_second)
        for rates in self._rates.values():
            rates.sort()
        self._gpu_jobs = gpu_jobs  # port_jobs sorts what it gathers: no per-GPU sort here
        self._job_nodes = {k: frozenset(v) for k, v in job_nodes.items()}
        self._port_jobs = {}

    def _remember(self, now: float, key: PortKey, nic: NicReading) -> None:
        memory = self._memory.get(key)
        if memory is None:
            memory = self._memory[key] = PortMemory()
        memory.seen = now
        if nic.up:
            memory.last_up = now
            memory.down_since = None
            rate, width = nic.rate_bytes_per_second, nic.link_width
            if rate and (memory.best_rate is None or rate > memory.best_rate):
                memory.best_rate = rate
            if width and (memory.best_width is None or width > memory.best_width):
                memory.best_width = width
            for table, value in ((self._wait, nic.transmit_wait_per_second), (self._cnp, nic.cnp_handled_per_second)):
                if value is not None:
                    reference = table.get(key)
                    if reference is None:
                        reference = table[key] = _Reference()
                    reference.note(now, value, self.window_s)
        elif memory.last_up is not None and memory.down_since is None:
            memory.down_since = now

    def expire(self, horizon: float) -> None:
        _expire_series(self._ports, horizon)
        _expire_series(self._hosts, horizon)
        _expire_series(self._job_hosts, horizon)
        for key in [k for k, m in self._memory.items() if m.seen < horizon]:
            del self._memory[key]
            self._wait.pop(key, None)
            self._cnp.pop(key, None)

    # ------------------------------------------------------------------------------------------ reading

    @property
    def nics(self) -> Sequence[NicReading]:
        """The latest round's ports, in snapshot order."""
        return self._latest

    def node_nics(self, node: str) -> Sequence[NicReading]:
        """The latest round's ports of one node."""
        return self._by_node.get(node, ())

    def port_series(self, key: PortKey) -> Sequence[tuple[float, NicReading]]:
        """A port's ``(round time, reading)`` pairs in the window, oldest first."""
        return self._ports.get(key, ())

    def memory(self, key: PortKey) -> PortMemory:
        return self._memory.get(key) or PortMemory()

    def baseline(self, key: PortKey) -> Baseline:
        wait, cnp = self._wait.get(key), self._cnp.get(key)
        return Baseline(
            wait.median() if wait is not None and wait.settled() else None,
            cnp.median() if cnp is not None and cnp.settled() else None,
        )

    def unchanged(self, key: PortKey, values: Callable[[NicReading], tuple[int | None, ...]]) -> bool:
        """Whether counters (``values`` reads several at once) are all known and the same in the port's oldest and
        newest reading of the window: then none of them rose in any part of it (``increase`` is 0 for each)."""
        series = self._ports.get(key)
        if not series or len(series) < 2:
            return False
        first = values(series[0][1])
        return None not in first and first == values(series[-1][1])

    def increase(self, key: PortKey, since: float, value: Callable[[NicReading], int | None]) -> float | None:
        """How much a port counter rose from its oldest reading at or after ``since`` to the latest (a counter that
        went back counts from zero); ``None`` with fewer than two readings of it."""
        series = self._ports.get(key)
        if not series:
            return None
        first, end = value(series[0][1]), value(series[-1][1])
        if first is not None and first == end and len(series) >= 2:
            return 0.0  # unchanged over the whole window: a counter that only rises did not rise in part of it
        i = bisect.bisect_left(series, since, key=lambda entry: entry[0])
        if i >= len(series) - 1:
            return None
        start = value(series[i][1])
        if start is None or end is None:
            return None
        return float(end - start if end >= start else end)

    def down_rounds(self, key: PortKey, since: float) -> int:
        """Up-to-down transitions of the port seen in the rounds at or after ``since``."""
        series = self._ports.get(key, ())
        i = bisect.bisect_left(series, since, key=lambda entry: entry[0]) if series else 0
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
            found = {job for gpu in nic.gpus for job in self._gpu_jobs.get((nic.node, gpu), ())}
            known = self._port_jobs[nic.key] = tuple(sorted(found))
        return known

    def peer_rate(self, nic: NicReading) -> float | None:
        """The median rate of the node's other up ports of the same link layer this round."""
        rates = self._rates.get((nic.node, nic.link_layer), [])  # sorted once a round, in ``add``
        if nic.up and nic.rate_bytes_per_second in rates:
            rates = rates.copy()
            rates.remove(nic.rate_bytes_per_second)
        return _sorted_median(rates)

    def job_nodes(self, job_id: str) -> frozenset[str]:
        """The nodes the job holds GPUs on this round."""
        return self._job_nodes.get(job_id, frozenset())

    def job_nics(self, gpus: Mapping[str, Sequence[int]]) -> list[NicReading]:
        """The latest readings of the ports next to the job's GPUs (``gpus``: indices by node)."""
        return [n for node, held in gpus.items() for n in self._by_node.get(node, ()) if set(n.gpus) & set(held)]

    def host(self, node: str) -> HostReading | None:
        return self._latest_hosts.get(node)

    def host_series(self, node: str) -> Sequence[tuple[float, HostReading]]:
        return self._hosts.get(node, ())

    def job_hosts(self, job_id: str) -> Sequence[JobHostReading]:
        """The job's share of each of its nodes this round."""
        return self._latest_job_hosts.get(job_id, ())
