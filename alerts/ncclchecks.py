"""``CommunicationStall`` from NCCL's own view (NCCL RAS): the signatures ``rank_missing`` and ``rank_dead``.

Each node's agent exports its own ranks (``NcclView``); a job's view is the union over the latest round's nodes.

- ``rank_dead``: RAS declares a rank's process dead (fires at once) or unresponsive (fires once that has held for
  ``ras_mismatch_for``).
- ``rank_missing``: a communicator shows the same mismatch of collective counts (every lagging rank's count and the
  highest count unchanged across RAS queries) for ``ras_mismatch_for``: the lagging ranks never launched the
  collective the others wait in. A transient mismatch and a straggler move from one query to the next and never
  age; a checkpoint or an evaluation phase freezes equal counts, which is no mismatch at all. A checkpoint saved
  by some ranks alone leaves them behind for the whole save: while every rank behind is busy by its own node's
  reading (its GPU copies to the host, its process writes or uses CPU: ``NcclRank.busy``) the signature holds back,
  for ``checkpoint_factor`` times the longest such save the job came back from (at least ``checkpoint_min_s``,
  ``alerts.ncclsaves``), or ``checkpoint_max_s`` while it has none (docs/nccl-checkpoints.md).

The summary names the communicator and the collective, and each stuck rank with its node, GPU, pid and the count it
reached against the others' count; the ``stuck_ranks`` annotation lists them one per line and ``cause`` says what RAS
saw. Hangs whose counts are equal (every rank launched; the data is stuck in the network) are left to the hardware
signatures.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from gpulens.alerts.base import AlertRule, Candidate, rule_labels
from gpulens.alerts.history import History, Round
from gpulens.alerts.ncclsaves import SaveLog, ceiling_s
from gpulens.config import format_duration
from gpulens.ncclmodel import (
    MISMATCH_HOLD_S,
    RANK_DEAD,
    RANK_OK,
    RANK_UNRESPONSIVE,
    NcclComm,
    NcclRank,
    NcclView,
    is_remote,
)

RANK_MISSING_SIGNATURE: Final = "rank_missing"
RANK_DEAD_SIGNATURE: Final = "rank_dead"
DEFAULT_RAS_MISMATCH_FOR_S: Final = MISMATCH_HOLD_S
CHECKPOINT_MAX_S: Final = 900.0  # the longest save held silent while every rank behind is busy (no save learned)
CHECKPOINT_FACTOR: Final = 2.0  # a job's busy spell behind is held silent for this times its longest save learned
CHECKPOINT_MIN_S: Final = 180.0  # and at least this long
BUSY_RECENT_S: Final = 60.0  # a rank its node saw busy this recently still counts as a writer (PromQL: [1m])
MAX_NAMED: Final = 8  # stuck ranks named in the summary; the annotation lists them all


@dataclass(frozen=True, slots=True)
class _Placed:
    node: str
    rank: NcclRank


def _describe(p: _Placed, collective: str | None, top: int | None) -> str:
    r = p.rank
    gpu = r.gpu if r.gpu is not None and r.gpu >= 0 else "?"
    where = f"{p.node} GPU {gpu} pid {r.pid if r.pid is not None else '?'}"
    if is_remote(r):  # another node's rank, before its own node's turn: where it runs, as the seeing node's RAS said
        where = f"GPU {gpu} pid {r.pid if r.pid is not None else '?'} on {r.host or 'another node'}, seen from {p.node}"
    if r.state in (RANK_DEAD, RANK_UNRESPONSIVE):
        return f"rank {r.rank} ({where}) {r.state}"
    count = r.counts.get(collective) if collective else None
    if count is not None and top is not None:
        return f"rank {r.rank} ({where}) at {count} against {top}"
    return f"rank {r.rank} ({where}) {r.lag or '?'} behind"


_GRAVITY: Final = {RANK_DEAD: 3, RANK_UNRESPONSIVE: 2}  # a rank's state only grows graver through an incident
_GONE: Final = (RANK_DEAD, RANK_UNRESPONSIVE)


def _weight(r: NcclRank) -> tuple[bool, int, bool]:
    return (r.state != RANK_OK or (r.lag or 0) > 0, _GRAVITY.get(r.state, 1), not is_remote(r))


# How ``_describe`` begins a stuck rank's line: what ``named_ranks`` reads back (one format, written and read here).
_NAMED: Final = re.compile(r"^rank (\d+) \((\S+) GPU ", re.MULTILINE)


def named_ranks(stuck_ranks: str) -> set[tuple[str, int]]:
    """The (node, rank) pairs a stall's ``stuck_ranks`` annotation names: the ranks its RAS signature accuses."""
    return {(node, int(rank)) for rank, node in _NAMED.findall(stuck_ranks)}


def _ranges(text: Iterable[str]) -> str:
    items = list(text)
    named = "; ".join(items[:MAX_NAMED])
    return named + (f"; and {len(items) - MAX_NAMED} more" if len(items) > MAX_NAMED else "")


def _thresholds(rule: AlertRule) -> tuple[float, float, float, float]:
    """``ras_mismatch_for``, ``checkpoint_max_s``, ``checkpoint_factor`` and ``checkpoint_min_s`` (defaults where a
    rule leaves them out)."""
    t = rule.thresholds
    hold_s = rule.threshold("ras_mismatch_for") if "ras_mismatch_for" in t else DEFAULT_RAS_MISMATCH_FOR_S
    ceiling_s = rule.threshold("checkpoint_max_s") if "checkpoint_max_s" in t else CHECKPOINT_MAX_S
    factor = rule.threshold("checkpoint_factor") if "checkpoint_factor" in t else CHECKPOINT_FACTOR
    floor_s = rule.threshold("checkpoint_min_s") if "checkpoint_min_s" in t else CHECKPOINT_MIN_S
    return hold_s, ceiling_s, factor, floor_s


@dataclass(frozen=True, slots=True)
class _RoundView:
    """What one round's NCCL views say of each communicator."""

    comms: dict[tuple[str, str], NcclComm]  # each one's answer with the oldest mismatch
    gone: dict[tuple[str, str], list[_Placed]]  # its dead or unresponsive ranks, where any
    stuck: dict[tuple[str, str], list[_Placed]]  # its ranks behind a mismatch held ``hold_s``
    busy: dict[tuple[str, str], bool]  # for those: whether every rank behind was busy lately (a checkpoint writer)


def _read_round(rounds: Sequence[Round], end: int, now: float, hold_s: float) -> _RoundView:
    """The communicators of ``rounds[end - 1]`` (the rounds before it tell which ranks were busy lately)."""
    views = rounds[end - 1].nccl
    comms: dict[tuple[str, str], NcclComm] = {}
    # A rank once: standing out where any node's answer shows it so (its own node's may be older), in the gravest
    # state shown, from its own node where that shows it too (another node's agent names it before its node's turn).
    # Only a communicator with a rank dead or unresponsive in some answer yields a candidate from its ranks (those
    # states weigh most): no other's ranks are weighed.
    gone_comms = {(r.job_id, r.comm) for v in views.values() for r in v.ranks if r.state in _GONE and r.job_id}
    seen: dict[tuple[str, str, int], _Placed] = {}
    for node, view in views.items():
        for r in view.ranks if gone_comms else ():
            at = (r.job_id or "", r.comm, r.rank)
            if (r.job_id, r.comm) in gone_comms and (at not in seen or _weight(r) > _weight(seen[at].rank)):
                seen[at] = _Placed(node, r)
        for c in view.comms:
            if not c.job_id:
                continue
            key = (c.job_id, c.comm)
            known = comms.get(key)
            if known is None or (c.mismatch_age_s or -1.0) > (known.mismatch_age_s or -1.0):
                comms[key] = c
    gone: dict[tuple[str, str], list[_Placed]] = {}
    for (job, comm_id, _), p in seen.items():
        if p.rank.state in _GONE:
            gone.setdefault((job, comm_id), []).append(p)
    stuck: dict[tuple[str, str], list[_Placed]] = {}
    busy: dict[tuple[str, str], bool] = {}
    for key, comm in comms.items():
        if key in gone or comm.mismatch_age_s is None or comm.mismatch_age_s < hold_s:
            continue
        behind = _held_behind(views, *key, hold_s, comm.collective)
        if behind:
            stuck[key] = behind
            busy[key] = all(_writing(rounds, end, now, *key, p) for p in behind)
    for key in gone:
        busy[key] = False  # a spell that ends in a dead rank is no save
    return _RoundView(comms, gone, stuck, busy)


def _observe(log: SaveLog, read: _RoundView, at: float, window_s: float) -> None:
    ages = {key: c.mismatch_age_s for key, c in read.comms.items()}
    log.observe(at, ages, read.busy, window_s)


def _save_log(history: History, hold_s: float, latest: _RoundView) -> SaveLog:
    """The job's saves learned so far, carried from the round before (``history.previous_memo``), or learned again
    from the window's rounds where nothing was carried (the first round, or a round in which the rule did not run)."""
    rounds = history.rounds
    key = ("nccl_saves", hold_s)
    log: SaveLog | None = history.previous_memo().get(key)
    if log is None or len(rounds) < 2 or log.at != rounds[-2].time:
        log = SaveLog(hold_s)
        for end in range(1, len(rounds)):
            _observe(
                log, _read_round(rounds, end, rounds[end - 1].time, hold_s), rounds[end - 1].time, history.window_s
            )
    _observe(log, latest, rounds[-1].time, history.window_s)
    history.memo()[key] = log
    return log


def nccl_stall_candidates(rule: AlertRule, history: History, now: float) -> dict[str, Candidate]:
    """Job -> its NCCL-signature stall, from the latest round's NCCL views."""
    latest = history.latest
    if latest is None:
        return {}
    hold_s, max_s, factor, floor_s = _thresholds(rule)
    rounds = history.rounds
    read = _read_round(rounds, len(rounds), now, hold_s)
    log = _save_log(history, hold_s, read)
    out: dict[str, Candidate] = {}
    for (job, comm_id), gone in sorted(read.gone.items()):
        dead = any(p.rank.state == RANK_DEAD for p in gone)
        comm = read.comms.get((job, comm_id))
        out[job] = _candidate(rule, history, job, comm, comm_id, gone, dead=dead, hold_s=hold_s, now=now)
    for (job, comm_id), stuck in sorted(read.stuck.items()):
        comm = read.comms[job, comm_id]
        if job in out or comm.mismatch_age_s is None:
            continue
        allowed_s = ceiling_s(log.longest(job), factor=factor, min_s=floor_s, max_s=max_s)
        if comm.mismatch_age_s < allowed_s and read.busy[job, comm_id]:
            continue  # every rank behind is busy: a checkpoint saved by those ranks, up to the job's own ceiling
        out[job] = _candidate(rule, history, job, comm, comm_id, stuck, dead=False, hold_s=hold_s, now=now)
    return out


def _held_behind(
    views: Mapping[str, NcclView], job: str, comm_id: str, hold_s: float, collective: str | None
) -> list[_Placed]:
    """The ranks behind in the answers that show the held mismatch (a node's comm and ranks come from one answer; a
    rank behind in another node's older answer may have caught up since), each named by its own node where that
    node's answer shows it at the same count."""
    behind: dict[int, _Placed] = {}
    for node, view in views.items():
        if not any(c.job_id == job and c.comm == comm_id and (c.mismatch_age_s or 0.0) >= hold_s for c in view.comms):
            continue
        for r in view.ranks:
            lagging = r.job_id == job and r.comm == comm_id and r.state == RANK_OK and (r.lag or 0) > 0
            if lagging and (r.rank not in behind or (is_remote(behind[r.rank].rank) and not is_remote(r))):
                behind[r.rank] = _Placed(node, r)
    count = (lambda r: r.counts.get(collective)) if collective else (lambda r: None)
    for node, view in views.items():
        for r in view.ranks:
            known = behind.get(r.rank)
            same = known is not None and r.job_id == job and r.comm == comm_id and count(r) == count(known.rank)
            if same and known is not None and is_remote(known.rank) and not is_remote(r):
                behind[r.rank] = _Placed(node, r)
    return [behind[k] for k in sorted(behind)]


def _writing(rounds: Sequence[Round], end: int, now: float, job: str, comm_id: str, p: _Placed) -> bool:
    """Whether the rank's own node saw it busy (``exporter.ncclbusy``: its GPU copies to the host, its process writes
    or uses CPU) in one of ``rounds[:end]`` within the last ``BUSY_RECENT_S`` (only a node's own ranks are judged, so
    any view that says so is its node's). The window covers the last rounds of a save, when another node's older
    answer still shows the writer behind and its own node's newer one already shows it caught up."""
    for i in range(end - 1, -1, -1):
        round_ = rounds[i]
        if round_.time <= now - BUSY_RECENT_S:
            return False
        for view in round_.nccl.values():
            for r in view.ranks:
                if r.busy is True and r.job_id == job and r.comm == comm_id and r.rank == p.rank.rank:
                    return True
    return False


def _candidate(
    rule: AlertRule,
    history: History,
    job: str,
    comm: NcclComm | None,
    comm_id: str,
    placed: list[_Placed],
    *,
    dead: bool,
    hold_s: float,
    now: float,
) -> Candidate:
    placed = sorted(placed, key=lambda p: p.rank.rank)
    collective = comm.collective if comm is not None else None
    top = comm.top_count if comm is not None else None
    lines = [_describe(p, collective, top) for p in placed]
    view = history.latest.jobs.get(job) if history.latest is not None else None
    user = view.user if view is not None else None
    nodes = sorted({p.node for p in placed})
    if dead or any(p.rank.state != RANK_OK for p in placed):
        signature = RANK_DEAD_SIGNATURE
        what = "dead" if dead else "unresponsive"
        summary = f"job {job}: NCCL RAS finds {len(placed)} rank(s) of communicator {comm_id} {what}: {_ranges(lines)}"
        cause = (
            f"NCCL RAS cannot reach the process of {len(placed)} rank(s) on {', '.join(nodes)} "
            f"({'considered dead after 60 s without an answer' if dead else 'unresponsive'}); the other ranks wait "
            f"for it in {collective or 'their next collective'}."
        )
        for_s = 0.0 if dead else hold_s
        began = now
    else:
        signature = RANK_MISSING_SIGNATURE
        age = comm.mismatch_age_s if comm is not None and comm.mismatch_age_s is not None else hold_s
        summary = (
            f"job {job}: communicator {comm_id} stuck in {collective or 'a collective'} for {format_duration(age)}; "
            f"{len(placed)} rank(s) never launched it: {_ranges(lines)}"
        )
        cause = (
            f"NCCL RAS shows the same collective counts for {format_duration(age)}: {len(placed)} rank(s) stopped "
            f"below the others' count {top if top is not None else '?'} in {collective or 'a collective'}, so the "
            "others wait for them (look at what those ranks do: py-spy dump, a data or host problem on their node)."
        )
        for_s = 0.0
        began = now - age  # the counts stopped moving
    labels = rule_labels(rule, {"job_id": job, "user": user or "", "signature": signature})
    description = cause + (f" User {user}." if user else "")
    # ``rank@node:gpu`` of each stuck rank, for the incident layer's joins (``alerts.incidentparts.stuck_ranks``)
    stuck_at = ",".join(f"{p.rank.rank}@{p.node}:{'' if p.rank.gpu is None else p.rank.gpu}" for p in placed)
    annotations = {"stuck_ranks": "\n".join(lines), "cause": cause, "stuck_at": stuck_at}
    return Candidate(
        rule.name, labels, float(len(placed)), summary, description, annotations=annotations, for_s=for_s, began=began
    )
