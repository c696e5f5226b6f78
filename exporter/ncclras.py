"""The node agent's NCCL RAS reader: when to query, and each answer mapped to this node's GPUs, processes and jobs.

RAS gathers the whole job on every query, so the nodes of a job take turns: a node queries only in the intervals
whose number (``floor(time / interval)``) modulo the job's node count equals its place among the job's hosts (sorted
by IP address, as RAS reports them). The cluster thus sends at most one status query per job per interval, and each
node refreshes its own ranks every ``nodes x interval``. A node learns the job's hosts from a JSON answer (a text
answer names only the ranks that stand out): until it knows them all, each node of the job queries once per the
job's node count (from the text report's job summary; ``DISCOVER_EVERY`` before any answer) in a slot picked by a
hash of its name, so two nodes may share a slot. An agent's very first query is sent at once. Queries run on a
background thread, so a slow RAS never delays a collection. Where RAS answers NCCL 2.29 or later, a ``MONITOR`` stream
(``exporter.ncclmonitor``) marks at once the ranks of a peer RAS finds dead, and its events bring a status query
outside the turn.

Each answer is mapped to gpulens's records once (the mapping is reused at every collection until the next answer
or a change of this node's processes): a rank's ``nvml_dev`` to the GPU UUID, its pid to the job through the job
mapper's processes, its host to this node. Only ranks on this node are kept (their host is one that a local GPU
process's rank reports), at most ``MAX_LOCAL_RANKS_PER_GPU`` per GPU, and the parser keeps no others: an answer that
claims more is cut and counted. The state kept between answers is bounded and pruned: hosts per job
(``MAX_JOB_HOSTS``, only those of communicators holding one of the job's processes here), mismatch ages only for the
communicators of the last answer, nothing for a job no longer on this node. Communicators are told apart by hash and
secondary hash; two of one hash are labelled with the secondary hash too.
"""

from __future__ import annotations

import logging
import math
import threading
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from gpulens.clock import Clock, SystemClock
from gpulens.exporter.ncclbusy import mark_busy
from gpulens.exporter.ncclmonitor import Link, Monitor, connect_monitor, speaks_monitor
from gpulens.exporter.ncclproc import ProcessActivity
from gpulens.exporter.ncclrasclient import RasAnswer, RasQueryError, query_status
from gpulens.exporter.ncclrasparse import RasComm, RasFormatError, RasRank, RasReport, pair_numbered, parse_report
from gpulens.exporter.ncclrasreport import MAX_OTHER_RANKS, LocalProcesses
from gpulens.exporter.ncclwide import MAX_REMOTE_STANDOUTS, REMOTE_FRESH_S, FollowUps, remote_standouts
from gpulens.logutil import ErrorCounter
from gpulens.model import NodeSnapshot
from gpulens.ncclmodel import RANK_OK, NcclComm, NcclRank, NcclView, is_remote

log = logging.getLogger(__name__)

DISCOVER_EVERY = 10  # intervals between queries while the job's hosts are not known yet
MAX_LOCAL_RANKS_PER_GPU = 16  # communicators a GPU's process belongs to (world, tensor, pipeline, data, ...)
MAX_JOB_HOSTS = 1024  # hosts remembered per job
MAX_TURN_PERIOD = 32  # intervals a node waits at most for its turn, whatever host list an answer gave
MAX_LOCAL_HOSTS = 16  # addresses of this node RAS reports
_STATUS_ORDER = ("INCOMPLETE", "ERROR", "MISMATCH")

Query = Callable[[], RasAnswer]


@dataclass
class _Answer:
    report: RasReport
    at: float  # clock time the query started
    seconds: float
    view: NcclView | None = None  # the report mapped to this node, for the processes in ``mapped_for``
    mapped_for: tuple[object, ...] | None = None
    follow_up: bool = False  # asked outside this node's turn, to confirm a mismatch (``exporter.ncclwide``)
    planned: bool = False  # its follow-ups are planned


def comm_status(comm: RasComm) -> str:
    flags = [s for s in _STATUS_ORDER if s in comm.status]
    return ",".join(flags) if flags else "OK"


def top_counts(comm: RasComm) -> dict[str, int]:
    """Collective -> the highest count any answering rank reached (the text report's majority counts included)."""
    return dict(comm.top)


def rank_lag(rank: RasRank, top: dict[str, int]) -> int | None:
    if not rank.counts:
        return None
    return max((top.get(name, count) - count for name, count in rank.counts.items()), default=0)


def mismatch_collective(comm: RasComm, top: dict[str, int]) -> str | None:
    """The collective whose counts spread widest over the communicator (the busiest one when none do)."""
    spread = {name: count - comm.low.get(name, count) for name, count in top.items()}
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
        monitor: Callable[[], Link] | None = None,
        proc_root: str | None = None,
    ) -> None:
        self._addr = addr
        # its ranks' processes' I/O and CPU (``exporter.ncclproc``); None: not read (the simulator's pids)
        self._activity = ProcessActivity(proc_root) if proc_root is not None else None
        self._interval = interval_s
        self._clock = clock or SystemClock()
        self._query = query or (lambda: query_status(addr))
        # the MONITOR stream's opener (its own connection, beside the status queries); opened once RAS says 2.29+
        self._connect = monitor or (None if query else lambda: connect_monitor(addr))
        self.monitor: Monitor | None = None
        self._background = background
        self._errors = ErrorCounter(log)
        self._lock = threading.Lock()
        self._inflight = False
        self._answer: _Answer | None = None
        self._error: str | None = None
        self._last_query_slot: int | None = None
        self._last_seconds: float | None = None
        self._hosts: dict[str, tuple[str, ...]] = {}  # job -> its hosts, sorted, from the last answer
        self._local_hosts: dict[str, None] = {}  # this node's addresses, oldest first
        self._local_pids: frozenset[int] = frozenset()
        self._max_kept = MAX_LOCAL_RANKS_PER_GPU
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
            period = min(period, MAX_TURN_PERIOD)
            return slot % period == zlib.crc32(node.encode()) % period
        for job in known:
            hosts = self._hosts[job]
            mine = [i for i, h in enumerate(hosts) if h in self._local_hosts]
            period = min(len(hosts), MAX_TURN_PERIOD)  # a hostile host list cannot push the turn further away
            if mine and slot % period == mine[0] % period:
                return True
        return False

    def _run(self, follow_up: bool) -> None:
        start = self._clock.now()
        with self._lock:
            hosts, pids, max_kept = set(self._local_hosts), self._local_pids, self._max_kept
        try:
            answer = self._query()
            # Only ranks that may be this node's are kept: on a host known to be this node's, or of a local pid.
            report = parse_report(
                answer.text,
                wanted=LocalProcesses(frozenset(hosts), pids),
                max_kept=max_kept,
                max_others=MAX_OTHER_RANKS,
            )
            pair_numbered(report)
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
            self._answer = _Answer(report, start, answer.seconds, follow_up=follow_up)
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
            self._local_pids = frozenset(p.pid for p in snapshot.processes)
            self._max_kept = MAX_LOCAL_RANKS_PER_GPU * max(1, len(snapshot.gpus))
            version = self._answer.report.version if self._answer is not None else None
        monitor = self._monitored(version)
        with self._lock:
            # an event of the stream is confirmed by a status query at once, outside the turn
            confirm = not self._inflight and monitor is not None and monitor.take_confirm()
            start = not self._inflight and (confirm or self._due(jobs, now, snapshot.node))
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
        view = self._mapped(snapshot, answer) if answer is not None else NcclView(up=False)
        ranks = view.ranks
        if answer is not None and now - answer.at > REMOTE_FRESH_S:  # other nodes' ranks only while fresh
            ranks = tuple(r for r in ranks if not is_remote(r))
        if monitor is not None:
            ranks = monitor.mark(ranks)
        view = NcclView(
            up=error is None,
            query_seconds=seconds,
            age_s=max(0.0, now - answer.at) if answer is not None else 0.0,
            format=view.format,
            version=view.version,
            error=error,
            comms=view.comms,
            ranks=ranks,
        )
        # its own ranks judged from its GPUs' copies and their processes' I/O and CPU now (exporter.ncclbusy)
        errors = {**snapshot.errors, **self._errors.snapshot()}
        activity = None
        if self._activity is not None:
            pids = (r.pid for r in ranks if r.pid is not None and r.state == RANK_OK and not is_remote(r))
            activity = self._activity.read(pids, now)
            errors.update(self._activity.errors.snapshot())
        return mark_busy(snapshot.replace(nccl=view, errors=errors), activity)

    def close(self) -> None:
        """Ends the MONITOR stream (status queries hold no connection between answers)."""
        if self.monitor is not None:
            self.monitor.stop()

    def _monitored(self, version: str | None) -> Monitor | None:
        """The MONITOR stream, opened once an answer showed NCCL 2.29+; read here where queries run inline."""
        if self.monitor is None and self._connect is not None and speaks_monitor(version):
            self.monitor = Monitor(self._connect, self._clock, self._errors)
            if self._background:
                self.monitor.start()
        if self.monitor is not None and not self._background:
            self.monitor.poll(0.0)
        return self.monitor

    def _mapped(self, snapshot: NodeSnapshot, answer: _Answer) -> NcclView:
        """The answer mapped to this node, once per answer and set of local processes and GPUs."""
        key = (
            tuple((p.pid, p.gpu, p.job_id) for p in snapshot.processes),
            tuple((g.gpu, g.uuid) for g in snapshot.gpus),
            tuple((j.gpu, j.job_id) for j in snapshot.jobs),
        )
        with self._lock:
            if answer.view is not None and answer.mapped_for == key:
                return answer.view
        view = self._view(snapshot, answer)
        with self._lock:
            answer.view, answer.mapped_for = view, key
        return view

    def _view(self, snapshot: NodeSnapshot, answer: _Answer) -> NcclView:
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
                    self._local_hosts.pop(r.host, None)
                    self._local_hosts[r.host] = None
                    while len(self._local_hosts) > MAX_LOCAL_HOSTS:
                        del self._local_hosts[next(iter(self._local_hosts))]
        jobs_here = {p.job_id for p in snapshot.processes if p.job_id}
        cap = MAX_LOCAL_RANKS_PER_GPU * max(1, len(snapshot.gpus))
        ranks: list[NcclRank] = []
        comms: list[NcclComm] = []
        hosts_of_job: dict[str, set[str]] = {}
        cut = report.ranks_dropped
        keys: set[tuple[str, str]] = set()
        duplicated = {h for h, n in Counter(c.comm for c in report.comms).items() if n > 1}
        ages: list[tuple[str, float]] = []
        remote: list[NcclRank] = []
        for comm in report.comms:
            local = [r for r in comm.ranks.values() if r.host in self._local_hosts]
            if not local:
                continue
            jobs = [pid_job.get(r.pid) if r.pid is not None else None for r in local]
            jobs += [job_of_gpu.get(r.nvml_dev) for r in local if r.nvml_dev is not None]
            job = next((j for j in jobs if j), None)
            if job is not None:
                known = hosts_of_job.setdefault(job, set())
                known.update(r.host for r in local if r.host)
                known.update(sorted(comm.hosts, key=_host_key)[: max(0, MAX_JOB_HOSTS - len(known))])
            label = comm_label(comm, duplicated)
            keys.add((job or "", label))
            top = top_counts(comm)
            collective = mismatch_collective(comm, top)
            status = comm_status(comm)
            age = self._mismatch_age((job or "", label), comm, answer.at)
            if age is not None:
                ages.append((job or "", age))
            comms.append(
                NcclComm(
                    job_id=job,
                    comm=label,
                    size=comm.size if comm.size is not None else len(comm.ranks),
                    status=status,
                    top_count=top.get(collective) if collective else None,
                    collective=collective,
                    mismatch_age_s=age,
                )
            )
            if age is not None:  # other nodes' ranks that stand out: named before their node's turn comes
                room = MAX_REMOTE_STANDOUTS - len(remote)
                remote += remote_standouts(comm, job, top, self._local_hosts, room, label) if room > 0 else []
            for r in sorted(local, key=lambda x: x.rank):
                if len(ranks) >= cap:
                    cut += 1
                    continue
                gpu = r.nvml_dev if r.nvml_dev is not None and r.nvml_dev >= 0 else None
                ranks.append(
                    NcclRank(
                        job_id=job,
                        comm=label,
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
            if report.format == "json":  # JSON names every rank: this answer's hosts replace the last one's
                seen.clear()
            seen.update(hosts)
            if len(seen) > MAX_JOB_HOSTS:  # keep this node's hosts and the lowest others
                mine = {h for h in seen if h in self._local_hosts}
                rest = sorted(seen - mine, key=_host_key)[: max(0, MAX_JOB_HOSTS - len(mine))]
                seen.clear()
                seen.update(mine, rest)
            if report.nodes_total is not None:
                self._period[job] = max(1, min(report.nodes_total, MAX_JOB_HOSTS))
            if report.format == "json" or len(seen) >= (report.nodes_total or 1 << 30):
                self._hosts[job] = tuple(sorted(seen, key=_host_key))
        # Nothing is kept for a job no longer on this node, nor for a communicator the last answer did not name.
        for job in [
            j for j in self._seen_hosts.keys() | self._period.keys() | self._hosts.keys() if j not in jobs_here
        ]:
            self._seen_hosts.pop(job, None)
            self._period.pop(job, None)
            self._hosts.pop(job, None)
            self._follow.forget([job])
        for key in [k for k in self._mismatch_since if k not in keys]:
            del self._mismatch_since[key]
        return NcclView(
            up=True,
            format=report.format,
            version=report.version,
            comms=tuple(comms[: MAX_LOCAL_RANKS_PER_GPU * max(1, len(snapshot.gpus))]),
            ranks=tuple(ranks + remote),
        )

    def _mismatch_age(self, key: tuple[str, str], comm: RasComm, at: float) -> float | None:
        """How long the communicator has shown this same mismatch: every rank's counts and state (the fingerprint
        the parser summed over all of them, those of other nodes included) unchanged since the first answer that
        showed them. None while the counts agree and no rank is missing."""
        if not comm.differing() and not comm.status & {"MISMATCH", "INCOMPLETE"}:
            self._mismatch_since.pop(key, None)
            return None
        signature = (comm.fingerprint, tuple(sorted(comm.top.items())), tuple(sorted(comm.low.items())))
        seen = self._mismatch_since.get(key)
        if seen is None or seen[0] != signature:
            self._mismatch_since[key] = (signature, at)
            return 0.0
        return at - seen[1]


def comm_label(comm: RasComm, duplicated: set[str]) -> str:
    """The communicator's ``comm`` label: its hash, and where two of the answer's communicators share it, its
    secondary hash's two numbers too (``<hash>-<host hash>-<pid hash>``)."""
    if comm.comm not in duplicated or not comm.secondary:
        return comm.comm
    host, _, pid = comm.secondary.partition(":")
    return f"{comm.comm}-{host.removeprefix('0x')}-{pid.removeprefix('0x')}"


def _host_key(host: str) -> tuple[int, tuple[int, ...], str]:
    """IPv4 addresses by number, then anything else by text: the same order on every node."""
    parts = host.split(".")
    if len(parts) == 4 and all(p.isdigit() for p in parts):
        return (0, tuple(int(p) for p in parts), "")
    return (1, (), host)
