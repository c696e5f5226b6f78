"""The node agent's NCCL RAS reader: when to query, and each answer mapped to this node's GPUs, processes and jobs.

RAS gathers the whole job on every query, so the nodes of a job take turns: a node queries only in the intervals
whose number (``floor(time / interval)``) modulo the job's node count equals its place among the job's hosts (sorted
by IP address, as RAS reports them). The cluster thus sends at most one status query per job per interval, and each
node refreshes its own ranks every ``nodes x interval``. A node learns the job's hosts from a JSON answer (a text
answer names only the ranks that stand out): until it knows them all, each node of the job queries once per the
job's node count (from the text report's job summary; ``DISCOVER_EVERY`` before any answer) in a slot picked by a
hash of its name, so two nodes may share a slot. An agent's very first query is sent at once. Queries run on a
background thread, so a slow RAS never delays a collection.

Each answer is mapped to gpulens's records: a rank's ``nvml_dev`` to the GPU UUID, its pid to the job through the
job mapper's processes, its host to this node. Only ranks on this node are kept (their host is one that a local GPU
process's rank reports), at most ``MAX_LOCAL_RANKS_PER_GPU`` per GPU: an answer that claims more is cut and counted.
"""

from __future__ import annotations

import logging
import math
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from gpulens.clock import Clock, SystemClock
from gpulens.exporter.ncclrasclient import RasAnswer, RasQueryError, query_status
from gpulens.exporter.ncclrasparse import RasComm, RasFormatError, RasRank, RasReport, parse_report
from gpulens.exporter.ncclwide import MAX_REMOTE_STANDOUTS, REMOTE_FRESH_S, FollowUps, remote_standouts
from gpulens.logutil import ErrorCounter
from gpulens.model import NodeSnapshot
from gpulens.ncclmodel import RANK_OK, NcclComm, NcclRank, NcclView

log = logging.getLogger(__name__)

DISCOVER_EVERY = 10  # intervals between queries while the job's hosts are not known yet
MAX_LOCAL_RANKS_PER_GPU = 16  # communicators a GPU's process belongs to (world, tensor, pipeline, data, ...)
_STATUS_ORDER = ("INCOMPLETE", "ERROR", "MISMATCH")

Query = Callable[[], RasAnswer]


@dataclass
class _Answer:
    report: RasReport
    at: float  # clock time the query started
    seconds: float
    follow_up: bool = False  # asked outside this node's turn, to confirm a mismatch (``exporter.ncclwide``)
    planned: bool = False  # its follow-ups are planned


def comm_status(comm: RasComm) -> str:
    flags = [s for s in _STATUS_ORDER if s in comm.status]
    return ",".join(flags) if flags else "OK"


def top_counts(comm: RasComm) -> dict[str, int]:
    """Collective -> the highest count any answering rank reached (the text report's majority counts included)."""
    top = dict(comm.majority)
    for r in comm.ranks.values():
        if r.state == RANK_OK:
            for name, count in r.counts.items():
                if count > top.get(name, -1):
                    top[name] = count
    return top


def rank_lag(rank: RasRank, top: dict[str, int]) -> int | None:
    if not rank.counts:
        return None
    return max((top.get(name, count) - count for name, count in rank.counts.items()), default=0)


def mismatch_collective(comm: RasComm, top: dict[str, int]) -> str | None:
    """The collective whose counts spread widest over the communicator (the busiest one when none do)."""
    spread: dict[str, int] = {}
    for r in comm.ranks.values():
        for name, count in r.counts.items():
            spread[name] = max(spread.get(name, 0), top.get(name, count) - count)
    if spread and max(spread.values()) > 0:
        return max(spread, key=lambda name: (spread[name], name))
    return max(top, key=lambda name: (top[name], name)) if top else None


class NcclRasReader:
    """Queries RAS in this node's turns and adds the ``nccl`` view to each snapshot (an enricher)."""

    def __init__(
        self,
        addr: str,
        *,
        interval_s: float = 1.0,
        clock: Clock | None = None,
        query: Query | None = None,
        background: bool = True,
    ) -> None:
        self._addr = addr
        self._interval = interval_s
        self._clock = clock or SystemClock()
        self._query = query or (lambda: query_status(addr))
        self._background = background
        self._errors = ErrorCounter(log)
        self._lock = threading.Lock()
        self._inflight = False
        self._answer: _Answer | None = None
        self._error: str | None = None
        self._last_query_slot: int | None = None
        self._last_seconds: float | None = None
        self._hosts: dict[str, tuple[str, ...]] = {}  # job -> its hosts, sorted, from the last answer
        self._local_hosts: set[str] = set()
        self._seen_hosts: dict[str, set[str]] = {}  # job -> every host a report named for it
        self._period: dict[str, int] = {}  # job -> its node count, from a text report's job summary
        self._mismatch_since: dict[tuple[str, str], tuple[object, float]] = {}  # (job, comm) -> (signature, since)
        self._follow = FollowUps()
        self.queries = 0  # status queries sent (the simulator counts them per job)

    # --- when to query -------------------------------------------------------------------------------------------

    def _due(self, jobs: set[str], now: float, node: str) -> bool:
        slot = math.floor(now / self._interval)
        if not jobs or slot == self._last_query_slot:
            return False
        if self._follow.is_due(now):
            return True
        known = [job for job in jobs if job in self._hosts]
        if len(known) < len(jobs):
            # Hosts not all known (a text report names only the ranks that stand out): every node of the job takes
            # one slot in ``period`` picked by its name, the job's node count once a report gave it.
            if self._last_query_slot is None:
                return True  # the agent's first query: at once
            period = min(self._period.get(job, DISCOVER_EVERY) for job in jobs if job not in self._hosts)
            return slot % period == zlib.crc32(node.encode()) % period
        for job in known:
            hosts = self._hosts[job]
            mine = [i for i, h in enumerate(hosts) if h in self._local_hosts]
            if mine and slot % len(hosts) == mine[0]:
                return True
        return False

    def _run(self, follow_up: bool) -> None:
        start = self._clock.now()
        try:
            answer = self._query()
            report = parse_report(answer.text)
        except (RasQueryError, RasFormatError) as exc:
            if isinstance(exc, RasQueryError) and exc.absent:
                # No RAS on this node (GPU processes without NCCL, or NCCL_RAS_ENABLE=0): shown as RAS down, never
                # counted as a collection error (a real H200 node running one PyTorch process counted 5 in 10 s)
                log.debug("%s", exc)
            else:
                reason = "nccl_ras_unreachable" if isinstance(exc, RasQueryError) else "nccl_ras_malformed"
                self._errors.count(reason, str(exc))
            with self._lock:
                self._error, self._inflight = str(exc), False
            return
        except Exception as exc:  # noqa: BLE001 - no answer may stop the reader: counted, logged once
            self._errors.count("nccl_ras_malformed", f"{type(exc).__name__}: {exc}")
            with self._lock:
                self._error, self._inflight = f"unreadable RAS answer ({type(exc).__name__})", False
            return
        with self._lock:
            self._answer = _Answer(report, start, answer.seconds, follow_up)
            self._error, self._inflight = None, False
            self._last_seconds = answer.seconds

    # --- the enricher --------------------------------------------------------------------------------------------

    def enrich(self, snapshot: NodeSnapshot) -> NodeSnapshot:
        now = self._clock.now()
        jobs = {p.job_id for p in snapshot.processes if p.job_id} | {j.job_id for j in snapshot.jobs}
        if not snapshot.processes:  # nothing runs on the GPUs: no NCCL job to read, and no view to keep showing
            return snapshot if snapshot.nccl is None else snapshot.replace(nccl=None)
        if not jobs:
            jobs = {""}  # GPU processes without a known job still run NCCL: query, mapped to no job
        with self._lock:
            start = not self._inflight and self._due(jobs, now, snapshot.node)
            if start:
                follow_up = self._follow.started(now)
                self._inflight = True
                self._last_query_slot = math.floor(now / self._interval)
                self.queries += 1
        if start:
            if self._background:
                threading.Thread(target=self._run, args=(follow_up,), daemon=True).start()
            else:
                self._run(follow_up)
        with self._lock:
            answer, error, seconds = self._answer, self._error, self._last_seconds
        if answer is None and error is None:
            return snapshot if snapshot.nccl is None else snapshot.replace(nccl=None)
        view = self._view(snapshot, answer, now) if answer is not None else NcclView(up=False)
        view = NcclView(
            up=error is None,
            query_seconds=seconds,
            age_s=view.age_s,
            format=view.format,
            version=view.version,
            error=error,
            comms=view.comms,
            ranks=view.ranks,
        )
        return snapshot.replace(nccl=view, errors={**snapshot.errors, **self._errors.snapshot()})

    def _view(self, snapshot: NodeSnapshot, answer: _Answer, now: float) -> NcclView:
        report = answer.report
        pid_job = {p.pid: p.job_id for p in snapshot.processes}
        pid_gpus: dict[int, set[int]] = {}
        for p in snapshot.processes:
            pid_gpus.setdefault(p.pid, set()).add(p.gpu)
        uuid_of = {g.gpu: g.uuid for g in snapshot.gpus}
        job_of_gpu = {j.gpu: j.job_id for j in snapshot.jobs}
        for comm in report.comms:  # learn which host addresses are this node's
            for r in comm.ranks.values():
                if r.host and r.pid in pid_gpus and (r.nvml_dev is None or r.nvml_dev in pid_gpus[r.pid]):
                    self._local_hosts.add(r.host)
        jobs_here = {p.job_id for p in snapshot.processes if p.job_id}
        cap = MAX_LOCAL_RANKS_PER_GPU * max(1, len(snapshot.gpus))
        ranks: list[NcclRank] = []
        comms: list[NcclComm] = []
        hosts_of_job: dict[str, set[str]] = {}
        ages: list[tuple[str, float]] = []
        remote: list[NcclRank] = []
        cut = 0
        for comm in report.comms:
            local = [r for r in comm.ranks.values() if r.host in self._local_hosts]
            if not local:
                continue
            jobs = [pid_job.get(r.pid) if r.pid is not None else None for r in local]
            jobs += [job_of_gpu.get(r.nvml_dev) for r in local if r.nvml_dev is not None]
            job = next((j for j in jobs if j), None)
            if job is not None:
                hosts_of_job.setdefault(job, set()).update(r.host for r in comm.ranks.values() if r.host)
            top = top_counts(comm)
            collective = mismatch_collective(comm, top)
            status = comm_status(comm)
            age = self._mismatch_age(job or "", comm, top, answer.at)
            if age is not None:
                ages.append((job or "", age))
            comms.append(
                NcclComm(
                    job_id=job,
                    comm=comm.comm,
                    size=comm.size if comm.size is not None else len(comm.ranks),
                    status=status,
                    top_count=top.get(collective) if collective else None,
                    collective=collective,
                    mismatch_age_s=age,
                )
            )
            if age is not None:  # other nodes' ranks that stand out: named before their node's turn comes
                room = MAX_REMOTE_STANDOUTS - len(remote)
                remote += remote_standouts(comm, job, top, self._local_hosts, room) if room > 0 else []
            for r in sorted(local, key=lambda x: x.rank):
                if len(ranks) >= cap:
                    cut += 1
                    continue
                gpu = r.nvml_dev if r.nvml_dev is not None and r.nvml_dev >= 0 else None
                ranks.append(
                    NcclRank(
                        job_id=job,
                        comm=comm.comm,
                        rank=r.rank,
                        host=r.host or "",
                        pid=r.pid if r.pid is not None and r.pid >= 0 else None,
                        gpu=gpu,
                        gpu_uuid=uuid_of.get(gpu) if gpu is not None else None,
                        counts=dict(r.counts),
                        lag=rank_lag(r, top) if r.state == RANK_OK else None,
                        state=r.state,
                    )
                )
        if not answer.planned:
            answer.planned = True
            self._follow.answered(ages, follow_up=answer.follow_up, at=answer.at)
        if cut:
            self._errors.count("nccl_ras_ranks_cut", f"RAS named {cut} more ranks on this node than it has room for")
        for job, hosts in hosts_of_job.items():
            seen = self._seen_hosts.setdefault(job, set())
            seen.update(hosts)
            if report.nodes_total is not None:
                self._period[job] = max(1, min(report.nodes_total, 4096))
            if report.format == "json" or len(seen) >= (report.nodes_total or 1 << 30):
                self._hosts[job] = tuple(sorted(seen, key=_host_key))
        for job in [j for j in self._seen_hosts if j not in hosts_of_job and j not in jobs_here]:
            self._seen_hosts.pop(job, None)
            self._period.pop(job, None)
            self._hosts.pop(job, None)
            self._follow.forget([job])
        for key in [k for k in self._mismatch_since if k[0] not in hosts_of_job and k[0] != ""]:
            del self._mismatch_since[key]
        return NcclView(
            up=True,
            age_s=max(0.0, now - answer.at),
            format=report.format,
            version=report.version,
            comms=tuple(comms[: MAX_LOCAL_RANKS_PER_GPU * max(1, len(snapshot.gpus))]),
            ranks=tuple(ranks + (remote if now - answer.at <= REMOTE_FRESH_S else [])),
        )

    def _mismatch_age(self, job: str, comm: RasComm, top: dict[str, int], at: float) -> float | None:
        """How long the communicator has shown this same mismatch: the counts of every lagging rank and the top
        counts unchanged since the first answer that showed them. None while the counts agree."""
        key = (job, comm.comm)
        lagging = tuple(
            sorted((r.rank, r.state, tuple(sorted(r.counts.items()))) for r in comm.ranks.values() if _behind(r, top))
        )
        if not lagging and "MISMATCH" not in comm.status:
            self._mismatch_since.pop(key, None)
            return None
        # A text report leaves the ranks at the most common count unnamed: that count stands in for them.
        signature = (lagging, tuple(sorted(top.items())), tuple(sorted(comm.majority.items())))
        seen = self._mismatch_since.get(key)
        if seen is None or seen[0] != signature:
            self._mismatch_since[key] = (signature, at)
            return 0.0
        return at - seen[1]


def _behind(r: RasRank, top: dict[str, int]) -> bool:
    if r.state != RANK_OK:
        return True
    return any(count < top.get(name, count) for name, count in r.counts.items())


def _host_key(host: str) -> tuple[int, tuple[int, ...], str]:
    """IPv4 addresses by number, then anything else by text: the same order on every node."""
    parts = host.split(".")
    if len(parts) == 4 and all(p.isdigit() for p in parts):
        return (0, tuple(int(p) for p in parts), "")
    return (1, (), host)
