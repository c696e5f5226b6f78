"""NCCL RAS in the simulator: each training job's collective counts over time, the RAS report it answers with, and
each node's agent-side reader (``gpulens.exporter.ncclras.NcclRasReader``, the real one) reading it.

A job launches ``OPS_PER_SECOND`` AllReduce operations per second while it trains; its counts stand still, equal on
every rank, through warm-up, checkpoints, evaluation and data-loader waits. While it trains a transient mismatch of
one or two operations comes and goes (``TRANSIENT_SHARE`` of the reports), and a straggler's rank lags by one to
three operations, a different number each report. A job with ``checkpoint_ranks`` checkpoints as a job that saves
from those ranks alone: the others launch the next collective and wait in it, so RAS shows the writers one operation
behind for the whole save. In a hang every count stops: the ranks of the hang's
``stuck_ranks`` one operation behind the others (none: all equal); a ``rank_dead`` leaves the others one ahead and
its process unresponsive after 5 s, dead after 60 s (pushed to each node's MONITOR stream from NCCL 2.29). A job with
``nccl_ras = false`` answers nothing.

The report is rendered in the job's NCCL generation (``nccl_version``: JSON from 2.28.7, text before) by
``gpulens.exporter.sim.rasserver`` and parsed by the agent's own code; only the TCP hop is left out here, so that a
replay runs in virtual time (``RasServer`` serves the same reports over the real protocol).
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Mapping

from gpulens.clock import ManualClock
from gpulens.exporter.ncclbusy import RankActivity, mark_busy
from gpulens.exporter.ncclmonitor import Link, connect_monitor
from gpulens.exporter.ncclras import NcclRasReader
from gpulens.exporter.ncclrasclient import RasAnswer, RasQueryError, query_status
from gpulens.exporter.sim import noise
from gpulens.exporter.sim.faults.rank_dead import RAS_DEAD_S, RAS_UNRESPONSIVE_S
from gpulens.exporter.sim.rasserver import (
    MonitorFeed,
    RasServer,
    RasState,
    SimComm,
    SimRank,
    render_json,
    render_text,
    speaks_json,
)
from gpulens.exporter.sim.specs import FaultSpec, GpuRef, JobSpec
from gpulens.exporter.sim.stepstate import CHECKPOINT, CHECKPOINT_WRITE, RUN, JobPhase
from gpulens.model import NodeSnapshot
from gpulens.ncclmodel import RANK_DEAD, RANK_OK, RANK_UNRESPONSIVE, NcclView

OPS_PER_SECOND = 2.0
TRANSIENT_SHARE = 0.3
# A ``checkpoint_ranks`` writer's process through the save: it serialises its state (one core) and writes it out
WRITER_ACTIVITY = RankActivity(io_bytes_per_second=400e6, cpu_cores=1.0)
_HANGS = ("comm_stall", "hang_spinning", "hang_blocked", "hang_mixed", "rank_dead")


class NcclSim:
    """The NCCL view of every training job, and one RAS reader per node."""

    def __init__(
        self,
        jobs: list[JobSpec],
        faults: list[FaultSpec],
        nodes: list[str],
        phase: Callable[[str, int], JobPhase | None],
        pids: Callable[[GpuRef], Mapping[str, int]],
        light: Callable[[str, int], NodeSnapshot],
        *,
        seed: int,
        origin: float,
        step_s: float,
        tcp: bool = False,
    ) -> None:
        self._jobs = [j for j in jobs if j.kind == "training" and len(j.gpus) >= 2]
        self._faults = {j.id: [f for f in faults if f.job == j.id] for j in self._jobs}
        self._ip = {name: f"10.{i // 250}.{i % 250}.1" for i, name in enumerate(nodes)}
        self._phase = phase
        self._pids = pids
        self._seed = seed
        self._origin = origin
        self._step = step_s
        self._counted: dict[str, tuple[int, int]] = {}  # job -> (step, operations launched by its end)
        self._clock = ManualClock(origin)
        self._readers: dict[str, NcclRasReader] = {}
        self._tcp = tcp  # each node's RAS on a port of 127.0.0.1, read over the real protocol (a live exporter)
        self._servers: dict[str, RasServer] = {}
        self._done: dict[str, tuple[int, NcclView | None, Mapping[str, int]]] = {}  # node -> its reader's last step
        self._light = light
        self._step_now = 0
        self._counted_queries: set[tuple[str, int, str]] = set()
        self._lock = threading.RLock()
        self.queries: dict[tuple[str, int], int] = {}  # (job, step) -> status queries answered

    @property
    def active(self) -> bool:
        return bool(self._jobs)

    def _count(self, job: JobSpec, k: int) -> int:
        done_k, count = self._counted.get(job.id, (self._first_step(job) - 1, 0))
        if k < done_k:  # asked about the past: count again from the start
            done_k, count = self._first_step(job) - 1, 0
        per_step = max(1, round(OPS_PER_SECOND * self._step))
        for step in range(done_k + 1, k + 1):
            phase = self._phase(job.id, step)
            if phase is not None and phase.mode == RUN:
                count += per_step
        self._counted[job.id] = (k, count)
        return count

    def _first_step(self, job: JobSpec) -> int:
        return math.floor((job.start - self._origin) / self._step)

    def state(self, job: JobSpec, k: int, t: float) -> RasState | None:
        if not job.nccl_ras or not job.running(t):
            return None
        count = self._count(job, k)
        hang = next((f for f in self._faults[job.id] if f.kind in _HANGS and f.active(t)), None)
        lag: dict[GpuRef, int] = {}
        dead: dict[GpuRef, str] = {}
        top = count
        if hang is not None:
            if hang.kind == "rank_dead" and hang.gpu is not None:
                top = count + 1
                lag[hang.gpu] = 1
                since = t - hang.start
                if since >= RAS_DEAD_S:
                    dead[hang.gpu] = RANK_DEAD
                elif since >= RAS_UNRESPONSIVE_S:
                    dead[hang.gpu] = RANK_UNRESPONSIVE
            elif hang.stuck:
                top = count + 1
                lag = dict.fromkeys(hang.stuck, 1)
        else:
            phase = self._phase(job.id, k)
            if phase is not None and phase.mode == RUN and count > 0:
                lag = self._running_lags(job, k)
            elif phase is not None and phase.mode in (CHECKPOINT, CHECKPOINT_WRITE) and job.checkpoint_ranks:
                top = count + 1  # the others launched the collective after the save and wait in it
                lag = dict.fromkeys(job.checkpoint_ranks, 1)
        ranks = []
        for rank, ref in enumerate(job.gpus):
            pid = self._pids(ref).get(job.id, 0)
            ops = max(0, top - lag.get(ref, 0))
            counts = {"AllReduce": ops, "AllGather": ops // 8, "Broadcast": 1}
            ranks.append(SimRank(rank, self._ip[ref.node], pid, ref.index, counts, dead.get(ref, RANK_OK)))
        comm = int(noise.unit(self._seed, "comm", job.id) * (1 << 62)) | 1
        return RasState(job.nccl_version, [SimComm(comm, ranks)], job=job.id)

    def _running_lags(self, job: JobSpec, k: int) -> dict[GpuRef, int]:
        lags: dict[GpuRef, int] = {}
        if noise.unit(self._seed, "nccl-transient", job.id, k) < TRANSIENT_SHARE:
            pick = int(noise.unit(self._seed, "nccl-rank", job.id, k) * len(job.gpus))
            lags[job.gpus[pick]] = 1 + int(noise.unit(self._seed, "nccl-ops", job.id, k) * 2)
        t = self._origin + k * self._step
        for f in self._faults[job.id]:
            if f.kind == "straggler" and f.active(t) and f.gpu is not None:
                lags[f.gpu] = 1 + int(noise.unit(self._seed, "nccl-straggler", job.id, k) * 3)
        return lags

    def enrich(self, node: str, snapshot: NodeSnapshot, k: int, t: float) -> NodeSnapshot:
        """The node's snapshot with its agent's NCCL view at step ``k``.

        The agent's reader keeps state from answer to answer (the job's hosts, its turn, how long a mismatch held),
        so it is taken through every step from the scenario's start in order, fed the node's processes only
        (``light``): the view at a step is then the same whatever order steps are asked for in. Asked for an
        earlier step than it has reached, the reader starts again from the scenario's start."""
        with self._lock:  # one clock for every node's reader: --all-nodes serves nodes from several threads
            view, errors = self._view_at(node, k)
        if view is None:
            return snapshot
        # the reader saw the node's processes only: its ranks judged again from the node's GPUs and processes
        return mark_busy(snapshot.replace(nccl=view, errors={**snapshot.errors, **errors}), self.activity(node, k, t))

    def activity(self, node: str, k: int, t: float) -> dict[int, RankActivity]:
        """pid -> what the process of each ``checkpoint_ranks`` writer on ``node`` does at step ``k``: through the
        whole save it writes and uses a core (its GPU copies only in the save's first steps); a writer a hang stopped
        does nothing. Other processes' I/O and CPU are not modelled (not read, as where ``/proc`` is unreadable)."""
        out: dict[int, RankActivity] = {}
        for job in self._jobs:
            if not job.checkpoint_ranks or not job.running(t):
                continue
            phase = self._phase(job.id, k)
            if phase is None or phase.mode not in (CHECKPOINT, CHECKPOINT_WRITE):
                continue
            stopped = {ref for f in self._faults[job.id] if f.kind in _HANGS and f.active(t) for ref in f.stuck}
            for ref in job.checkpoint_ranks:
                pid = self._pids(ref).get(job.id) if ref.node == node and ref not in stopped else None
                if pid is not None:
                    out[pid] = WRITER_ACTIVITY
        return out

    def _reader(self, node: str) -> NcclRasReader:
        query = self._query(node)
        state = functools.partial(self._node_state, node)
        monitor: Callable[[], Link] = lambda: MonitorFeed(state, json=True)  # noqa: E731
        if self._tcp:
            server = self._servers.get(node)
            if server is None:
                server = self._servers[node] = RasServer(
                    lambda: self._node_state(node),
                    on_status=lambda state: self._count_query(state, node),
                    monitor_state=functools.partial(self._locked_state, node),
                )
            query = functools.partial(query_status, server.addr)
            monitor = functools.partial(connect_monitor, server.addr)
        return NcclRasReader(
            f"sim://{node}", interval_s=self._step, clock=self._clock, query=query, background=False, monitor=monitor
        )

    def _view_at(self, node: str, k: int) -> tuple[NcclView | None, Mapping[str, int]]:
        done = self._done.get(node)
        if done is not None and done[0] == k:
            return done[1], done[2]
        if done is None or done[0] > k:
            if node in self._readers:
                self._readers[node].close()
            self._readers[node] = self._reader(node)
            first = 0
        else:
            first = done[0] + 1
        reader = self._readers[node]
        out = None
        for step in range(first, k + 1):
            self._clock.set(self._origin + step * self._step)
            self._step_now = step
            out = reader.enrich(self._light(node, step))
        view = out.nccl if out is not None else (done[1] if done is not None and done[0] < k else None)
        errors = dict(out.errors) if out is not None else {}
        self._done[node] = (k, view, errors)
        return view, errors

    def _node_state(self, node: str) -> RasState | None:
        """What the node's RAS port answers now: the first running job on it (None: no job with RAS listens)."""
        t = self._clock.now()
        k = math.floor((t - self._origin) / self._step + 1e-9)
        for job in self._jobs:
            if job.running(t) and any(ref.node == node for ref in job.gpus):
                return self.state(job, k, t)
        return None

    def _locked_state(self, node: str) -> RasState | None:
        with self._lock:  # a MONITOR stream's thread, beside the readers
            return self._node_state(node)

    def _count_query(self, state: RasState, node: str = "") -> None:
        """Count a status query once, however often a reader is taken through the same step again."""
        k = self._step_now
        key = (state.job, k, node)
        if key not in self._counted_queries:
            self._counted_queries.add(key)
            self.queries[state.job, k] = self.queries.get((state.job, k), 0) + 1

    def _query(self, node: str) -> Callable[[], RasAnswer]:
        def query() -> RasAnswer:
            state = self._node_state(node)
            if state is None:
                raise RasQueryError(f"nothing listens at sim://{node} (no NCCL job with RAS on this node)", absent=True)
            self._count_query(state, node)
            if speaks_json(state.version):
                return RasAnswer(render_json(state), "json", 0.0)
            return RasAnswer(render_text(state), "text", 0.0)

        return query

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        for server in self._servers.values():
            server.close()
        self._servers.clear()
