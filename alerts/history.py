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

What every rule needs of a round is worked out once, in ``add``: a job's reference keeps the values its medians are
taken of sorted as rounds join and leave it (``reference_medians``), so neither the reference test nor the detectors'
baselines sort a window each round (at 1,000 nodes they had cost more than half of the job rules).
"""

from __future__ import annotations

import bisect
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Collection, Hashable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter, ne
from typing import Any, Final

from gpulens.alerts.fabrichistory import FabricWindow
from gpulens.alerts.gpucolumns import GpuColumns
from gpulens.alerts.jobround import (
    REFERENCE_MIN_SHARE,
    REFERENCE_MIN_UTILIZATION,
    REFERENCE_SETTLED_ROUNDS,
    JobRound,
    JobView,
    _median,
    _sorted_median,
    nvlink_bytes_per_second,
    summarise_job,
    traffic_bytes_per_second,
)
from gpulens.model import GpuJob, GpuReading, NodeSnapshot, TargetHealth
from gpulens.ncclinspect import InspectorView
from gpulens.ncclmodel import NcclView
from gpulens.nodehardware import NodeHardware

# JobRound and its helpers live in ``gpulens.alerts.jobround``; the rules and tests import them from here as before.
__all__ = [
    "History",
    "JobPause",
    "JobRound",
    "JobView",
    "Round",
    "nvlink_bytes_per_second",
    "summarise_job",
    "traffic_bytes_per_second",
]

_NODE_AND_GPU: Final = attrgetter("node", "gpu")
_UUID: Final = attrgetter("uuid")

# The counters the GPU error rules compare across their window (``History.gpus_moved``): PCIe replays, NVLink
# errors, uncorrectable ECC errors.
ERROR_COUNTERS: Final = attrgetter(
    "pcie_replays_total",
    "nvlink_crc_flit_errors_total",
    "nvlink_replay_errors_total",
    "nvlink_recovery_errors_total",
    "ecc_uncorrected_errors_total",
)


_UNKNOWN: Final = object()


@dataclass(frozen=True, slots=True)
class Round:
    """One scrape round: the readings of every node that answered, and the health of every target."""

    time: float
    gpus: Mapping[str, GpuReading]  # by UUID
    gpu_jobs: Mapping[str, tuple[GpuJob, ...]]  # UUID -> the jobs holding it
    jobs: Mapping[str, JobView]
    nodes: frozenset[str]  # nodes whose snapshot arrived
    targets: tuple[TargetHealth, ...]
    nccl: Mapping[str, NcclView] = field(default_factory=dict)  # node -> its agent's NCCL RAS view
    hardware: Mapping[str, NodeHardware] = field(default_factory=dict)  # node -> its hardware against expectations
    drivers: Mapping[str, str] = field(default_factory=dict)  # node -> its driver version, where known
    nvml_hung: Mapping[str, float] = field(default_factory=dict)  # node -> since when its NVML is hung
    inspector: Mapping[str, InspectorView] = field(default_factory=dict)  # node -> NCCL Inspector's bandwidths


def _fits(reference: Sequence[JobRound], summary: JobRound, usual: float | None = None) -> bool:
    """Whether a busy, communicating round moves as much data as the job's settled reference does (``usual``: the
    median of the reference's traffic when known, else worked out here)."""
    if len(reference) < REFERENCE_SETTLED_ROUNDS or summary.traffic_median is None:
        return True
    if usual is None:
        usual = _median(r.traffic_median for r in reference)
    return usual is None or summary.traffic_median >= REFERENCE_MIN_SHARE * usual


# What the job detectors take medians of over a job's reference (``detect.baseline``), traffic first.
REFERENCE_MEDIANS: Final = attrgetter(
    "traffic_median", "nvlink_median", "power_median", "sm_active_median", "memory_median"
)


@dataclass(frozen=True, slots=True)
class JobPause:
    """A job's pauses: since when some GPU of it has been idle (``None`` while all work), and the longest pause it
    came back from after its work had begun (0 when none): how long its healthy quiet phases last."""

    since: float | None
    longest_s: float


class _Track:
    """One job's summaries: the rounds of the window, its reference rounds, and its pauses."""

    __slots__ = ("last_busy", "longest_pause_s", "ordered", "pause_since", "reference", "rounds", "worked")

    def __init__(self) -> None:
        self.rounds: deque[JobRound] = deque()
        self.reference: deque[JobRound] = deque()
        # The reference's values of each of REFERENCE_MEDIANS that are not None, each list sorted; ``None`` once a
        # NaN came (NaNs do not sort: the medians are then worked out from the rounds, as ``detect.baseline`` does).
        self.ordered: tuple[list[float], ...] | None = ([], [], [], [], [])
        self.pause_since: float | None = None
        self.longest_pause_s = 0.0
        self.worked = False  # it has had a reference round: a pause before that is its start, not a phase
        self.last_busy: float | None = None  # the latest round its median GPU was busy (any number of GPUs)

    def add_reference(self, summary: JobRound, window_s: float) -> None:
        """Append a reference round, and drop those more than ``window_s`` older than it."""
        reference, ordered = self.reference, self.ordered
        reference.append(summary)
        if ordered is not None:
            for values, value in zip(ordered, REFERENCE_MEDIANS(summary), strict=True):
                if value is not None:
                    if value != value:  # NaN
                        self.ordered = ordered = None
                        break
                    insort(values, value)
        horizon = summary.time - window_s
        while reference[0].time < horizon:
            old = reference.popleft()
            if ordered is not None:
                for values, value in zip(ordered, REFERENCE_MEDIANS(old), strict=True):
                    if value is not None:
                        del values[bisect_left(values, value)]

    def reference_medians(self) -> tuple[float | None, ...] | None:
        """The medians of REFERENCE_MEDIANS over the reference (``None`` where they must be worked out)."""
        if self.ordered is None:
            return None
        return tuple(_sorted_median(values) for values in self.ordered)

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
        self._counter_columns: tuple[list[str], list[Any]] = ([], [])  # the latest round's UUIDs, ERROR_COUNTERS
        self._counters_moved: dict[str, float] = {}  # UUID -> the latest round its ERROR_COUNTERS changed
        self._moved: set[str] = set()  # gpus_moved, this round
        self._tracks: dict[str, _Track] = {}
        self._node_seen: dict[str, float] = {}
        self._target_down_since: dict[str, float] = {}
        self._since: dict[tuple[str, float], tuple[float, GpuReading] | None] = {}  # reading_since, this round
        self.fabric = FabricWindow(
            window_s
        )  # the RDMA ports, hosts and jobs' host shares (gpulens.alerts.fabrichistory)
        self._round_since: dict[float, int] = {}  # since -> index of the first round at or after it, this round
        self._up: list[tuple[GpuReading, Sequence[GpuJob]]] | None = None  # up_gpus, this round
        self._columns: GpuColumns | None = None  # columns(), this round
        self._missing: frozenset[str] | None = None  # missing_nodes, this round
        self._lost: frozenset[str] | None = None  # lost_gpus, this round
        self._memo: dict[Hashable, Any] = {}  # memo(), this round
        self._previous_memo: dict[Hashable, Any] = {}  # memo() of the round before
        self._extended: list[str] = []  # jobs whose track the latest round extended
        self.walked = 0  # GPU series and job tracks the latest round's expiry visited beyond those it read

    # ------------------------------------------------------------------------------------------ adding

    def add(self, now: float, snapshots: Sequence[NodeSnapshot], targets: Sequence[TargetHealth] = ()) -> None:
        """Add one scrape round taken at ``now``; rounds must come in time order."""
        if self._rounds and now < self._rounds[-1].time:
            raise ValueError(f"round at {now} is older than the last one at {self._rounds[-1].time}")
        gpus: dict[str, GpuReading] = {}
        gpu_jobs: dict[str, tuple[GpuJob, ...]] = {}
        node_seen = self._node_seen
        for snap in snapshots:
            node_seen[snap.node] = now
            readings = snap.gpus
            gpus.update(zip(map(_UUID, readings), readings, strict=True))  # by UUID, the last read winning
            for job in snap.jobs:
                held = gpu_jobs.get(job.uuid)
                gpu_jobs[job.uuid] = (job,) if held is None else (*held, job)  # most GPUs: one job
        jobs = self._job_views(gpu_jobs)
        for target in targets:
            if target.up:
                self._target_down_since.pop(target.target, None)
            else:
                self._target_down_since.setdefault(target.target, now)
        round_ = Round(
            time=now,
            gpus=gpus,
            gpu_jobs=gpu_jobs,
            jobs=jobs,
            nodes=frozenset(s.node for s in snapshots),
            targets=tuple(targets),
            nccl={s.node: s.nccl for s in snapshots if s.nccl is not None},
            hardware={s.node: s.hardware for s in snapshots if s.hardware is not None},
            drivers={s.node: s.driver_version for s in snapshots if s.driver_version},
            nvml_hung={s.node: s.nvml_hung_since for s in snapshots if s.nvml_hung_since is not None},
            inspector={s.node: s.inspector for s in snapshots if s.inspector is not None},
        )
        self._rounds.append(round_)
        self._since.clear()
        self._round_since.clear()
        self._up = self._missing = self._lost = None
        self._columns = None
        self._previous_memo, self._memo = self._memo, {}
        all_series = self._series
        horizon = now - self.window_s
        self._note_counters(now, gpus)
        for uuid, reading in gpus.items():
            series = all_series.get(uuid)
            if series is None:  # not setdefault: it would build a deque for every GPU of every round
                series = all_series[uuid] = deque()
            series.append((now, reading))
            while series[0][0] < horizon:  # what ``_expire`` would drop: done here for the GPUs of the round
                series.popleft()
        moved = self._counters_moved
        for uuid in [u for u, t in moved.items() if t < horizon]:  # before the window: every GPU's oldest reading
            del moved[uuid]
        self._moved = {u for u, t in moved.items() if u in gpus and t >= all_series[u][0][0]}
        self._summarise_jobs(round_)
        self.fabric.add(now, snapshots)
        self._expire(now)

    def _note_counters(self, now: float, gpus: Mapping[str, GpuReading]) -> None:
        """Note the GPUs whose ``ERROR_COUNTERS`` differ from their reading before (``_counters_moved``: since when),
        before ``add`` appends the round to the series. Column-wise: a round of the same GPUs as the round before
        (the common case) is compared with it by maps, without a step per GPU."""
        uuids, counters = list(gpus), list(map(ERROR_COUNTERS, gpus.values()))
        before_uuids, before = self._counter_columns
        if uuids == before_uuids:
            changed = [uuids[i] for i in compress(range(len(uuids)), map(ne, counters, before))]
        else:  # GPUs came or went: each compared with its latest reading in the window
            known = dict(zip(before_uuids, before, strict=True))
            changed = []
            for uuid, values in zip(uuids, counters, strict=True):
                last = known.get(uuid, _UNKNOWN)
                if last is _UNKNOWN:
                    series = self._series.get(uuid)
                    last = ERROR_COUNTERS(series[-1][1]) if series else values
                if last != values:
                    changed.append(uuid)
        for uuid in changed:
            self._counters_moved[uuid] = now
        self._counter_columns = (uuids, counters)

    @staticmethod
    def _job_views(gpu_jobs: Mapping[str, Sequence[GpuJob]]) -> dict[str, JobView]:
        members: dict[str, list[GpuJob]] = {}
        for held in gpu_jobs.values():
            for job in held:
                found = members.get(job.job_id)
                if found is None:
                    members[job.job_id] = [job]
                else:
                    found.append(job)
        views = {}
        for job_id, held in members.items():
            ordered = sorted(held, key=_NODE_AND_GPU) if len(held) > 1 else held
            user = next((j.user for j in ordered if j.user), None)
            views[job_id] = JobView(job_id, user, tuple(j.uuid for j in ordered))
        return views

    def _summarise_jobs(self, round_: Round) -> None:
        tracks = self._tracks
        horizon = round_.time - self.window_s
        extended = []
        for job_id, view in round_.jobs.items():
            readings = [r for uuid in view.gpus if (r := round_.gpus.get(uuid)) is not None and r.up]
            if not readings:
                continue
            summary = summarise_job(round_.time, readings)
            extended.append(job_id)
            track = tracks.get(job_id)
            if track is None:
                track = tracks[job_id] = _Track()
            rounds = track.rounds
            rounds.append(summary)
            while rounds[0].time < horizon:  # what ``_expire`` would drop: done here for the jobs of the round
                rounds.popleft()
            reference = summary.is_reference
            if reference and len(track.reference) >= REFERENCE_SETTLED_ROUNDS:
                traffic = track.ordered[0] if track.ordered is not None else None
                reference = _fits(track.reference, summary, _sorted_median(traffic) if traffic is not None else None)
            if reference:
                track.add_reference(summary, self.window_s)
            track.note_pause(summary, reference)
        self._extended = extended

    def _expire(self, now: float) -> None:
        horizon = now - self.window_s
        while self._rounds and self._rounds[0].time < horizon:
            self._rounds.popleft()
        latest = self._rounds[-1] if self._rounds else None
        # ``add`` trimmed the series of the latest round's GPUs and the rounds of its jobs: only the others (few: GPUs
        # and jobs that left) need a pass here.
        read = latest is not None and latest.time == now
        stale: Collection[str] = list(self._series)
        if read and latest is not None:  # every GPU of the latest round has a series: the others, when there are more
            stale = self._series.keys() - latest.gpus.keys() if len(self._series) > len(latest.gpus) else ()
        for uuid in stale:
            series = self._series[uuid]
            if series[-1][0] < horizon:
                del self._series[uuid]
                continue
            while series[0][0] < horizon:
                series.popleft()
        walked = len(stale)
        stale = list(self._tracks)
        if read:
            stale = self._tracks.keys() - self._extended if len(self._tracks) > len(self._extended) else ()
        for job_id in stale:
            rounds = self._tracks[job_id].rounds
            if not rounds or rounds[-1].time < horizon:
                del self._tracks[job_id]
                continue
            while rounds[0].time < horizon:
                rounds.popleft()
        self.walked = walked + len(stale)
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

    def gpus_moved(self) -> Set[str]:
        """The latest round's GPUs whose ``ERROR_COUNTERS`` may differ between their oldest and newest reading of the
        window (a superset): one changed from one reading to the next within the window. Every other GPU's counters
        are the same in every reading of the window, which is where the error rules find nothing (their own first
        test)."""
        return self._moved

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

    def job_reference_medians(self, job_id: str) -> tuple[float | None, ...] | None:
        """The medians of ``REFERENCE_MEDIANS`` over the job's reference, in that order (a median is ``None`` when
        no round read the value); ``None`` for a job without a track, or when they must be worked out from
        ``job_reference`` (a NaN reached it)."""
        track = self._tracks.get(job_id)
        return track.reference_medians() if track else None

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

    def previous_memo(self) -> Mapping[Hashable, Any]:
        """``memo`` as the round before left it: what a rule worked out then and can carry on from (an idle GPU's
        idle spell), where it checks that nothing came between."""
        return self._previous_memo

    def up_gpus(self) -> Sequence[tuple[GpuReading, Sequence[GpuJob]]]:
        """The latest round's GPUs that are up, with the jobs holding each (computed once per round)."""
        latest = self.latest
        if latest is None:
            return ()
        if self._up is None:
            jobs = latest.gpu_jobs
            self._up = [(r, jobs.get(uuid, ())) for uuid, r in latest.gpus.items() if r.up]
        return self._up

    def columns(self) -> GpuColumns:
        """``up_gpus`` as columns (``alerts.gpucolumns``), built once per round, each column when first asked."""
        if self._columns is None:
            self._columns = GpuColumns(self.up_gpus())
        return self._columns
