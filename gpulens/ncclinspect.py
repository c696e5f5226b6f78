"""The NCCL Inspector's measure of a job's collectives: records shared by every layer, and the one way they are
summarised.

NCCL's Inspector (a profiler plugin, NCCL 2.28.3+) writes each collective's time and bus bandwidth per rank and
communicator. The node agent reads what the ranks on its node wrote (``InspectorRecord``, already in bytes/s and
seconds) and keeps, per job, communicator, collective and message-size class, the bus bandwidth and the collective
time (``InspectorSeries``): one series per key and node, so a job's nodes can be told apart. ``summarise`` is the
one place records become series: the exporter and the simulator both go through it.

A message-size class is the power of two at or below the message size (``size_class``): collectives of 3 MiB and
of 2 MiB are one class, ``2MiB``; a job compares a collective's bandwidth only with the same collective of the same
class, because small messages never reach a link's bandwidth.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

BYTES_PER_GB: Final = 1e9  # NCCL's GB/s are 10^9 bytes per second (busBw = bytes / time / 1e3 with time in us)
SECONDS_PER_US: Final = 1e-6
# Series one node keeps (keys of job, communicator, collective and size class); more are dropped and counted.
MAX_SERIES: Final = 256
_UNITS: Final = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def size_class(size_bytes: int) -> str:
    """The message-size class of a collective of ``size_bytes``: the power of two at or below it, e.g. ``64MiB``."""
    if size_bytes <= 0:
        return "0B"
    power = min(size_bytes.bit_length() - 1, 10 * len(_UNITS) - 1)
    unit, rest = divmod(power, 10)
    return f"{1 << rest}{_UNITS[unit]}"


def size_class_bytes(label: str) -> int | None:
    """The lower bound in bytes of a ``size_class`` label (None when it is not one)."""
    for i, unit in reversed(list(enumerate(_UNITS))):
        if label.endswith(unit) and label[: -len(unit)].isdigit():
            return int(label[: -len(unit)]) << (10 * i)
    return None


@dataclass(frozen=True, slots=True)
class InspectorRecord:
    """One rank's measure of one collective (or NCCL's mean over several: ``count``), in bytes/s and seconds."""

    comm: str  # the communicator's hash ("0x...") or, where NCCL gives only that, its name
    collective: str  # "AllReduce", "ReduceScatter", ...
    size_bytes: int
    bus_bytes_per_second: float
    seconds: float
    rank: int | None = None
    pid: int | None = None
    job_id: str | None = None
    gpu: str | None = None  # the GPU's UUID where the output names it or the rank's process maps to one
    count: int = 1


@dataclass(frozen=True, slots=True)
class InspectorSeries:
    """One node's measure of one collective and size class of one communicator, over the records last read."""

    job_id: str | None
    comm: str
    collective: str
    size: str  # size_class of the messages
    bus_bytes_per_second: float  # geometric mean over the records (NCCL's own summary of bandwidths)
    seconds: float  # arithmetic mean collective time
    samples: int  # collectives the means stand for
    ranks: int  # this node's ranks that measured them
    # The rank on this node with the lowest bandwidth, its GPU and that bandwidth: where a slow rank sits.
    slowest_rank: int | None = None
    slowest_gpu: str | None = None
    slowest_bus_bytes_per_second: float | None = None


@dataclass(frozen=True, slots=True)
class InspectorView:
    """What the node agent last read of the Inspector's files."""

    files: int  # Inspector files under the directory
    records: int  # records read in the last pass
    series: tuple[InspectorSeries, ...] = ()
    dropped_series: int = 0  # keys past MAX_SERIES in the last pass
    error: str | None = None  # why the last pass failed or what it skipped, one line


def series_key(s: InspectorSeries) -> tuple[str, str, str, str]:
    return (s.job_id or "", s.comm, s.collective, s.size)


def summarise(records: Iterable[InspectorRecord], limit: int = MAX_SERIES) -> tuple[list[InspectorSeries], int]:
    """The records' series, sorted by key, and how many keys past ``limit`` were dropped. Bandwidths of zero or less
    (a collective NCCL could not time) are left out of the bandwidth mean, as NCCL does."""
    groups: dict[tuple[str, str, str, str], _Acc] = {}
    dropped: set[tuple[str, str, str, str]] = set()
    for r in records:
        key = (r.job_id or "", r.comm, r.collective, size_class(r.size_bytes))
        acc = groups.get(key)
        if acc is None:
            if len(groups) >= limit:
                dropped.add(key)
                continue
            acc = groups[key] = _Acc()
        acc.add(r)
    out = [acc.series(key) for key, acc in sorted(groups.items())]
    return [s for s in out if s is not None], len(dropped)


class _Rank:
    __slots__ = ("gpu", "log_sum", "n")

    def __init__(self, gpu: str | None) -> None:
        self.log_sum = 0.0
        self.n = 0
        self.gpu = gpu


class _Acc:
    __slots__ = ("bw_count", "count", "log_sum", "ranks", "time_sum")

    def __init__(self) -> None:
        self.log_sum = 0.0
        self.bw_count = 0
        self.time_sum = 0.0
        self.count = 0
        self.ranks: dict[int, _Rank] = {}  # rank (-1 when unknown) -> its bandwidth's log sum

    def add(self, r: InspectorRecord) -> None:
        n = max(1, r.count)
        self.count += n
        self.time_sum += r.seconds * n
        if r.bus_bytes_per_second > 0 and math.isfinite(r.bus_bytes_per_second):
            lg = math.log(r.bus_bytes_per_second) * n
            self.log_sum += lg
            self.bw_count += n
            held = self.ranks.setdefault(-1 if r.rank is None else r.rank, _Rank(r.gpu))
            held.log_sum += lg
            held.n += n
            held.gpu = r.gpu or held.gpu

    def series(self, key: tuple[str, str, str, str]) -> InspectorSeries | None:
        if self.bw_count == 0:
            return None
        rank, slow = min(self.ranks.items(), key=lambda kv: (kv[1].log_sum / kv[1].n, kv[0]))
        return InspectorSeries(
            job_id=key[0] or None,
            comm=key[1],
            collective=key[2],
            size=key[3],
            bus_bytes_per_second=math.exp(self.log_sum / self.bw_count),
            seconds=self.time_sum / self.count,
            samples=self.count,
            ranks=len(self.ranks),
            slowest_rank=None if rank < 0 else rank,
            slowest_gpu=slow.gpu,
            slowest_bus_bytes_per_second=math.exp(slow.log_sum / slow.n),
        )


@dataclass(frozen=True, slots=True)
class BandwidthPoint:
    """One stored measure of a job's collective on one node (what the job page draws)."""

    time: float
    node: str
    comm: str
    collective: str
    size: str
    bus_bytes_per_second: float
