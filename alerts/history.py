"""A rolling in-memory window of recent scrape rounds: what the rules look at.

``History.add`` takes one round (every node's snapshot and every target's health) after each scrape. It keeps, for
the last ``window_s`` seconds, each GPU's readings, the jobs holding each GPU, and per job a summary of the round
(``JobRound``). A job also keeps its *reference*: its most recent rounds of normal, communicating work (every GPU
busy, data moving, clocks even), kept for ``window_s`` back from the newest such round however long ago that was.
The stall and straggler detectors compare the present with it, so a stall that lasts longer than the window still
has a baseline. And it keeps its *pauses* (``JobPause``): since when some GPU of it has been idle, and the longest
such pause it came back from after it had begun its work (checkpoints, data-loader waits), however long ago.
``History.fabric`` (``alerts.fabrichistory.FabricWindow``) keeps the same window of the RDMA ports, the hosts and the
jobs' host shares.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gpulens.model import GpuJob, GpuReading, NodeSnapshot, TargetHealth

from .fabrichistory import FabricWindow

# A round is part of a job's reference when the job's median GPU is at least this busy and moves at least this much
# data (NVLink + PCIe, both directions), and its slowest SM clock is within this share of the median clock. Once the
# reference holds REFERENCE_SETTLED_ROUNDS rounds, a round must also move at least REFERENCE_MIN_SHARE of the
# reference's median traffic: a round that moves far less is not normal work (a stall's trickle is not a baseline).
REFERENCE_MIN_UTILIZATION: Final = 0.5
REFERENCE_MIN_TRAFFIC_BYTES_PER_SECOND: Final = 500e6
REFERENCE_MIN_CLOCK_RATIO: Final = 0.9
REFERENCE_MIN_SHARE: Final = 0.2
REFERENCE_SETTLED_ROUNDS: Final = 6


def traffic_bytes_per_second(reading: GpuReading) -> float | None:
    """NVLink plus PCIe throughput, both directions; ``None`` when the source reads none of them."""
    values = (
        reading.nvlink_tx_bytes_per_second,
        reading.nvlink_rx_bytes_per_second,
        reading.pcie_tx_bytes_per_second,
        reading.pcie_rx_bytes_per_second,
    )
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def nvlink_bytes_per_second(reading: GpuReading) -> float | None:
    values = [v for v in (reading.nvlink_tx_bytes_per_second, reading.nvlink_rx_bytes_per_second) if v is not None]
    return sum(values) if values else None


def _median(values: Iterable[float | None]) -> float | None:
    """``statistics.median`` of the values that are not ``None`` (inline: it runs for every job every round)."""
    present = sorted([v for v in values if v is not None])
    n = len(present)
    if not n:
        return None
    mid = n // 2
    return present[mid] if n % 2 else (present[mid - 1] + present[mid]) / 2


def _max(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


@dataclass(frozen=True, slots=True)
class JobView:
    """A job as one round saw it: its user and the UUIDs of its GPUs (ordered by node and index)."""

    job_id: str
    user: str | None
    gpus: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class JobRound:
    """One job in one round, summarised over its GPUs that answered and are up."""

    time: float
    gpus: int  # GPUs read (up) this round
    utilization_min: float | None
    utilization_median: float | None
    utilization_max: float | None
    traffic_max: float | None  # bytes/s, NVLink + PCIe both directions, the busiest GPU
    traffic_median: float | None
    nvlink_median: float | None
    power_max: float | None
    power_median: float | None
    sm_active_median: float | None
    clock_ratio_min: float | None  # slowest SM clock / median SM clock
    memory_min: float | None  # bytes used on the GPU using the least
    memory_median: float | None

    @property
    def is_reference(self) -> bool:
        """Normal, communicating work: busy, moving data, no GPU's clock far below the others'."""
        return (
            self.gpus >= 2
            and self.utilization_median is not None
            and self.utilization_median >= REFERENCE_MIN_UTILIZATION
            and self.traffic_median is not None
            and self.traffic_median >= REFERENCE_MIN_TRAFFIC_BYTES_PER_SECOND
            and (self.clock_ratio_min is None or self.clock_ratio_min >= REFERENCE_MIN_CLOCK_RATIO)
        )

    @property
    def is_pause(self) -> bool:
        """Some GPU of the job is not working (a data-loader wait, a checkpoint, or some kind of hang)."""
        return self.utilization_min is not None and self.utilization_min < REFERENCE_MIN_UTILIZATION


def summarise_job(time: float, readings: Sequence[GpuReading]) -> JobRound:
    """The ``JobRound`` of a job's up GPUs' readings."""
    if len(readings) == 1:
        return _summarise_one(time, readings[0])
    clocks = [r.sm_clock_hertz for r in readings if r.sm_clock_hertz]
    clock_median = _median(clocks)
    traffic = [traffic_bytes_per_second(r) for r in readings]
    utilization = [r.utilization_ratio for r in readings if r.utilization_ratio is not None]
    memory = [float(r.memory_used_bytes) for r in readings if r.memory_used_bytes is not None]
    return JobRound(
        time=time,
        gpus=len(readings),
        utilization_min=min(utilization, default=None),
        utilization_median=_median(utilization),
        utilization_max=max(utilization, default=None),
        traffic_max=_max(traffic),
        traffic_median=_median(traffic),
        nvlink_median=_median(nvlink_bytes_per_second(r) for r in readings),
        power_max=_max(r.power_watts for r in readings),
        power_median=_median(r.power_watts for r in readings),
        sm_active_median=_median(r.sm_active_ratio for r in readings),
        clock_ratio_min=min(clocks) / clock_median if clocks and clock_median else None,
        memory_min=min(memory, default=None),
        memory_median=_median(memory),
    )


def _summarise_one(time: float, r: GpuReading) -> JobRound:
    """``summarise_job`` of a single-GPU job (most jobs of an inference fleet), without the lists and medians."""
    util, traffic, clock = r.utilization_ratio, traffic_bytes_per_second(r), r.sm_clock_hertz
    memory = float(r.memory_used_bytes) if r.memory_used_bytes is not None else None
    return JobRound(
        time=time,
        gpus=1,
        utilization_min=util,
        utilization_median=util,
        utilization_max=util,
        traffic_max=traffic,
        traffic_median=traffic,
        nvlink_median=nvlink_bytes_per_second(r),
        power_max=r.power_watts,
        power_median=r.power_watts,
        sm_active_median=r.sm_active_ratio,
        clock_ratio_min=clock / clock if clock else None,
        memory_min=memory,
        memory_median=memory,
    )


@dataclass(frozen=True, slots=True)
class Round:
    """One scrape round: the readings of every node that answered, and the health of every target."""

    time: float
    gpus: Mapping[str, GpuReading]  # by UUID
    gpu_jobs: Mapping[str, tuple[GpuJob, ...]]  # UUID -> the jobs holding it
    jobs: Mapping[str, JobView]
    nodes: frozenset[str]  # nodes whose snapshot arrived
    targets: tuple[TargetHealth, ...]


def _fits(reference: Sequence[JobRound], summary: JobRound) -> bool:
    """Whether a busy, communicating round moves as much data as the job's settled reference does."""
    if len(reference) < REFERENCE_SETTLED_ROUNDS or summary.traffic_median is None:
        return True
    usual = _median(r.traffic_median for r in reference)
    return usual is None or summary.traffic_median >= REFERENCE_MIN_SHARE * usual


@dataclass(frozen=True, slots=True)
class JobPause:
    """A job's pauses: since when some GPU of it has been idle (``None`` while all work), and the longest pause it
    came back from after its work had begun (0 when none): how long its healthy quiet phases last."""

    since: float | None
    longest_s: float


class _Track:
    """One job's summaries: the rounds of the window, its reference rounds, and its pauses."""

    __slots__ = ("last_busy", "longest_pause_s", "pause_since", "reference", "rounds", "worked")

    def __init__(self) -> None:
        self.rounds: deque[JobRound] = deque()
        self.reference: deque[JobRound] = deque()
        self.pause_since: float | None = None
        self.longest_pause_s = 0.0
        self.worked = False  # it has had a reference round: a pause before that is its start, not a phase
        self.last_busy: float | None = None  # the latest round its median GPU was busy (any number of GPUs)

    def note_pause(self, summary: JobRound, began_work: bool) -> None:
        if summary.utilization_median is not None and summary.utilization_median >= REFERENCE_MIN_UTILIZATION:
            self.last_busy = summary.time
        if summary.is_pause:
            if self.pause_since is None:
                self.pause_since = summary.time
        else:
            if self.pause_since is not None and self.worked:
                self.longest_pause_s = max(self.longest_pause_s, summary.time - self.pause_since)
            self.pause_since = None
        self.worked = self.worked or began_work


class History:
    """Rolling window of recent scrape rounds, enough for baselines (default 30 minutes)."""

    def __init__(self, window_s: float = 1800.0) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be positive")
        self.window_s = window_s
        self._rounds: deque[Round] = deque()
        self._series: dict[str, deque[tuple[float, GpuReading]]] = {}
        self._tracks: dict[str, _Track] = {}
        self._node_seen: dict[str, float] = {}
        self._target_down_since: dict[str, float] = {}
        self._since: dict[tuple[str, float], tuple[float, GpuReading] | None] = {}  # reading_since, this round
        self.fabric = FabricWindow(window_s)  # the RDMA ports, hosts and jobs' host shares (alerts.fabrichistory)
        self._round_since: dict[float, int] = {}  # since -> index of the first round at or after it, this round
        self._up: list[tuple[GpuReading, Sequence[GpuJob]]] | None = None  # up_gpus, this round
        self._missing: frozenset[str] | None = None  # missing_nodes, this round
        self._lost: frozenset[str] | None = None  # lost_gpus, this round
        self._memo: dict[Hashable, Any] = {}  # memo(), this round

    # ------------------------------------------------------------------------------------------ adding

    def add(self, now: float, snapshots: Sequence[NodeSnapshot], targets: Sequence[TargetHealth] = ()) -> None:
        """Add one scrape round taken at ``now``; rounds must come in time order."""
        if self._rounds and now < self._rounds[-1].time:
            raise ValueError(f"round at {now} is older than the last one at {self._rounds[-1].time}")
        gpus: dict[str, GpuReading] = {}
        gpu_jobs: dict[str, list[GpuJob]] = {}
        for snap in snapshots:
            self._node_seen[snap.node] = now
            for reading in snap.gpus:
                gpus[reading.uuid] = reading
            for job in snap.jobs:
                gpu_jobs.setdefault(job.uuid, []).append(job)
        jobs = self._job_views(gpu_jobs)
        for target in targets:
            if target.up:
                self._target_down_since.pop(target.target, None)
            else:
                self._target_down_since.setdefault(target.target, now)
        round_ = Round(
            time=now,
            gpus=gpus,
            gpu_jobs={uuid: tuple(js) for uuid, js in gpu_jobs.items()},
            jobs=jobs,
            nodes=frozenset(s.node for s in snapshots),
            targets=tuple(targets),
        )
        self._rounds.append(round_)
        self._since.clear()
        self._round_since.clear()
        self._up = self._missing = self._lost = None
        self._memo.clear()
        all_series = self._series
        for uuid, reading in gpus.items():
            series = all_series.get(uuid)
            if series is None:  # not setdefault: it would build a deque for every GPU of every round
                series = all_series[uuid] = deque()
            series.append((now, reading))
        self._summarise_jobs(round_)
        self.fabric.add(now, snapshots)
        self._expire(now)

    @staticmethod
    def _job_views(gpu_jobs: Mapping[str, list[GpuJob]]) -> dict[str, JobView]:
        members: dict[str, list[GpuJob]] = {}
        for held in gpu_jobs.values():
            for job in held:
                members.setdefault(job.job_id, []).append(job)
        views = {}
        for job_id, held in members.items():
            ordered = sorted(held, key=lambda j: (j.node, j.gpu)) if len(held) > 1 else held
            user = next((j.user for j in ordered if j.user), None)
            views[job_id] = JobView(job_id, user, tuple(j.uuid for j in ordered))
        return views

    def _summarise_jobs(self, round_: Round) -> None:
        for job_id, view in round_.jobs.items():
            readings = [r for uuid in view.gpus if (r := round_.gpus.get(uuid)) is not None and r.up]
            if not readings:
                continue
            summary = summarise_job(round_.time, readings)
            track = self._tracks.setdefault(job_id, _Track())
            track.rounds.append(summary)
            reference = summary.is_reference and _fits(track.reference, summary)
            if reference:
                track.reference.append(summary)
                while track.reference[0].time < summary.time - self.window_s:
                    track.reference.popleft()
            track.note_pause(summary, reference)

    def _expire(self, now: float) -> None:
        horizon = now - self.window_s
        while self._rounds and self._rounds[0].time < horizon:
            self._rounds.popleft()
        gone = []
        for uuid, series in self._series.items():  # one pass over every GPU: it runs each round
            if series[-1][0] < horizon:
                gone.append(uuid)
                continue
            while series[0][0] < horizon:
                series.popleft()
        for uuid in gone:
            del self._series[uuid]
        for job_id in [j for j, t in self._tracks.items() if not t.rounds or t.rounds[-1].time < horizon]:
            del self._tracks[job_id]
        for track in self._tracks.values():
            while track.rounds[0].time < horizon:
                track.rounds.popleft()
        for node in [n for n, seen in self._node_seen.items() if seen < horizon]:
            del self._node_seen[node]
        self.fabric.expire(horizon)

    # ------------------------------------------------------------------------------------------ reading

    @property
    def latest(self) -> Round | None:
        return self._rounds[-1] if self._rounds else None

    @property
    def rounds(self) -> Sequence[Round]:
        return self._rounds

    def series(self, uuid: str) -> Sequence[tuple[float, GpuReading]]:
        """A GPU's ``(round time, reading)`` pairs in the window, oldest first."""
        return self._series.get(uuid, ())

    def round_since(self, since: float) -> Round | None:
        """The oldest round taken at or after ``since`` (``None`` when there is none)."""
        first = self._round_since.get(since)
        if first is None:
            first = self._round_since[since] = bisect.bisect_left(self._rounds, since, key=lambda r: r.time)
        return self._rounds[first] if first < len(self._rounds) else None

    def reading_since(self, uuid: str, since: float) -> tuple[float, GpuReading] | None:
        """The GPU's oldest reading taken at or after ``since`` (several rules ask the same in one round)."""
        # Every GPU's series holds the rounds it appeared in: when the GPU is in the first round at or after
        # ``since``, that round holds the answer (one bisect per ``since`` and round instead of one per GPU).
        round_ = self.round_since(since)
        if round_ is None:
            return None
        reading = round_.gpus.get(uuid)
        if reading is not None:
            return round_.time, reading
        key = (uuid, since)
        if key in self._since:
            return self._since[key]
        series = self._series.get(uuid)
        found = None
        if series:
            i = bisect.bisect_left(series, since, key=lambda entry: entry[0])
            found = series[i] if i < len(series) else None
        self._since[key] = found
        return found

    def first_seen(self, uuid: str) -> float | None:
        series = self._series.get(uuid)
        return series[0][0] if series else None

    def job_rounds(self, job_id: str) -> Sequence[JobRound]:
        """The job's summaries over the window, oldest first."""
        track = self._tracks.get(job_id)
        return track.rounds if track else ()

    def job_reference(self, job_id: str) -> Sequence[JobRound]:
        """The job's recent rounds of normal, communicating work (see ``JobRound.is_reference``)."""
        track = self._tracks.get(job_id)
        return track.reference if track else ()

    def job_pause(self, job_id: str) -> JobPause:
        """The job's current pause and the longest it came back from (see ``JobPause``)."""
        track = self._tracks.get(job_id)
        return JobPause(track.pause_since, track.longest_pause_s) if track else JobPause(None, 0.0)

    def job_last_busy(self, job_id: str) -> float | None:
        """The latest round in which the job's median GPU was busy (kept while the job is in the window)."""
        track = self._tracks.get(job_id)
        return track.last_busy if track else None

    def target_down_since(self, target: str) -> float | None:
        """When the target's current run of failed scrapes began, or ``None`` while it answers."""
        return self._target_down_since.get(target)

    def missing_nodes(self) -> frozenset[str]:
        """Nodes seen within the window whose snapshot did not arrive in the latest round."""
        latest = self.latest
        if latest is None:
            return frozenset()
        if self._missing is None:
            self._missing = frozenset(node for node in self._node_seen if node not in latest.nodes)
        return self._missing

    def lost_gpus(self) -> frozenset[str]:
        """UUIDs of the GPUs that read ``up = false`` in the latest round."""
        latest = self.latest
        if latest is None:
            return frozenset()
        if self._lost is None:
            self._lost = frozenset(uuid for uuid, r in latest.gpus.items() if not r.up)
        return self._lost

    def memo(self) -> dict[Hashable, Any]:
        """Scratch space for what rules derive from the latest round and share (a job's baseline): emptied by
        each ``add``."""
        return self._memo

    def up_gpus(self) -> Sequence[tuple[GpuReading, Sequence[GpuJob]]]:
        """The latest round's GPUs that are up, with the jobs holding each (computed once per round)."""
        latest = self.latest
        if latest is None:
            return ()
        if self._up is None:
            jobs = latest.gpu_jobs
            self._up = [(r, jobs.get(uuid, ())) for uuid, r in latest.gpus.items() if r.up]
        return self._up
