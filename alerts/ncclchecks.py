"""``CommunicationStall`` from NCCL's own view (NCCL RAS): the signatures ``rank_missing`` and ``rank_dead``.

Each node's agent exports its own ranks (``NcclView``); a job's view is the union over the latest round's nodes.

- ``rank_dead``: RAS declares a rank's process dead (fires at once) or unresponsive (fires once that has held for
  ``ras_mismatch_for``).
- ``rank_missing``: a communicator shows the same mismatch of collective counts (every lagging rank's count and the
  highest count unchanged across RAS queries) for ``ras_mismatch_for``: the lagging ranks never launched the
  collective the others wait in. A transient mismatch and a straggler move from one query to the next and never
  age; a checkpoint or an evaluation phase freezes equal counts, which is no mismatch at all. A checkpoint saved
  by some ranks alone leaves them behind for the whole save: while every rank behind is busy by its own node's
  reading (its GPU copies to the host, ``NcclRank.busy``) the signature holds back, up to ``checkpoint_max_s``
  (docs/nccl-checkpoints.md).

The summary names the communicator and the collective, and each stuck rank with its node, GPU, pid and the count it
reached against the others' count; the ``stuck_ranks`` annotation lists them one per line and ``cause`` says what RAS
saw. Hangs whose counts are equal (every rank launched; the data is stuck in the network) are left to the hardware
signatures.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from gpulens.alerts.base import AlertRule, Candidate, rule_labels
from gpulens.alerts.history import History
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
CHECKPOINT_MAX_S: Final = 900.0  # the longest save held silent while every rank behind copies to the host
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


def nccl_stall_candidates(rule: AlertRule, history: History, now: float) -> dict[str, Candidate]:
    """Job -> its NCCL-signature stall, from the latest round's NCCL views."""
    latest = history.latest
    if latest is None or not latest.nccl:
        return {}
    hold_s = rule.threshold("ras_mismatch_for") if "ras_mismatch_for" in rule.thresholds else DEFAULT_RAS_MISMATCH_FOR_S
    ceiling_s = rule.threshold("checkpoint_max_s") if "checkpoint_max_s" in rule.thresholds else CHECKPOINT_MAX_S
    ranks: dict[tuple[str, str], list[_Placed]] = {}
    comms: dict[tuple[str, str], NcclComm] = {}
    # A rank once: standing out where any node's answer shows it so (its own node's may be older), in the gravest
    # state shown, from its own node where that shows it too (another node's agent names it before its node's turn).
    # Only a communicator with a rank dead or unresponsive in some answer yields a candidate from its ranks (those
    # states weigh most): no other's ranks are weighed.
    gone_comms = {(r.job_id, r.comm) for v in latest.nccl.values() for r in v.ranks if r.state in _GONE and r.job_id}
    seen: dict[tuple[str, str, int], _Placed] = {}
    for node, view in latest.nccl.items():
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
    for (job, comm_id, _), p in seen.items():
        ranks.setdefault((job, comm_id), []).append(p)
    out: dict[str, Candidate] = {}
    for (job, comm_id), placed in sorted(ranks.items()):
        gone = [p for p in placed if p.rank.state in _GONE]
        if gone:
            dead = any(p.rank.state == RANK_DEAD for p in gone)
            out[job] = _candidate(
                rule, history, job, comms.get((job, comm_id)), comm_id, gone, dead=dead, hold_s=hold_s, now=now
            )
    for (job, comm_id), comm in sorted(comms.items()):
        if job in out or comm.mismatch_age_s is None or comm.mismatch_age_s < hold_s:
            continue
        stuck = _held_behind(latest.nccl, job, comm_id, hold_s, comm.collective)
        if stuck and comm.mismatch_age_s < ceiling_s and all(_writing(history, now, job, comm_id, p) for p in stuck):
            continue  # every rank behind copies to the host: a checkpoint saved by those ranks, up to the ceiling
        if stuck:
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


def _writing(history: History, now: float, job: str, comm_id: str, p: _Placed) -> bool:
    """Whether the rank's own node saw it copy to the host while behind within the last ``BUSY_RECENT_S``
    (``exporter.ncclbusy``; only a node's own ranks are judged, so any view that says so is its node's). The window
    covers the last rounds of a save, when another node's older answer still shows the writer behind and its own
    node's newer one already shows it caught up."""
    for round_ in reversed(history.rounds):
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
