"""What one node's RAS answer tells about the whole job, so that a hang is named within a minute at any job size.

The nodes of a job take turns to query RAS (``exporter.ncclras``), so each node refreshes its own ranks only every
``nodes x interval``: 128 s for a 128-node job at a 1 s interval, 21 minutes in the simulator's 10 s step. Yet every
answer covers the whole job. Two things make the answer count where it lands:

- **Standouts of other nodes.** A node passes on the ranks of other nodes that stand out in its answer (behind their
  communicator, unresponsive, dead or missing), at most ``MAX_REMOTE_STANDOUTS`` per answer. Such a rank carries
  its GPU index as RAS reported it (``-1`` when RAS named none) and no GPU UUID: ``ncclmodel.is_remote`` tells it
  apart. Its process and GPU are another node's; the alert rules name it by the node whose agent owns it once that
  node's turn has come, and by the node that saw it until then. They are passed on for ``REMOTE_FRESH_S`` after the
  query (the job's other nodes have answered since), so that a rank which recovered is not shown behind for the
  ``nodes x interval`` until this node's next turn.
- **A confirmation query.** A mismatch ages only from one answer to the next of the same node (its counts held). A
  node whose turn shows a new mismatch (a lagging, missing, unresponsive or dead rank) asks again itself
  ``ncclmodel.MISMATCH_HOLD_S`` later, outside its turn, so the mismatch has aged that long in one node's answers
  when it still holds: the rule's default hold. A follow-up never starts another (a straggler's lag, different at
  every answer, costs one extra query per turn); a held mismatch that a turn shows younger than the hold is asked
  again when it reaches it. The cluster thus sends at most two status queries per job per interval.
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from typing import Final

from gpulens.exporter.ncclrasparse import RasComm, RasRank
from gpulens.ncclmodel import MISMATCH_HOLD_S, RANK_OK, NcclRank

MAX_REMOTE_STANDOUTS: Final = 64  # other nodes' ranks one answer passes on (a hang names a few)
REMOTE_FRESH_S: Final = 2 * MISMATCH_HOLD_S  # how long an answer passes them on: the job's other nodes answer since


def stands_out(rank: RasRank, top: dict[str, int]) -> bool:
    """Behind its communicator's highest count in some collective, or not answering at all."""
    if rank.state != RANK_OK:
        return True
    return any(count < top.get(name, count) for name, count in rank.counts.items())


def remote_standouts(
    comm: RasComm,
    job: str | None,
    top: dict[str, int],
    local_hosts: Container[str],
    room: int,
    label: str | None = None,
) -> list[NcclRank]:
    """The ranks of ``comm`` on other hosts that stand out, lowest rank first, at most ``room`` of them; ``label`` is
    the communicator's ``comm`` label (its hash, unless two share it)."""
    out: list[NcclRank] = []
    for r in sorted(comm.ranks.values(), key=lambda x: x.rank):
        if len(out) >= room:
            break
        if not r.host or r.host in local_hosts or not stands_out(r, top):
            continue
        lag = max((top.get(n, c) - c for n, c in r.counts.items()), default=0) if r.counts else None
        out.append(
            NcclRank(
                job_id=job,
                comm=label or comm.comm,
                rank=r.rank,
                host=r.host,
                pid=r.pid if r.pid is not None and r.pid >= 0 else None,
                gpu=r.nvml_dev if r.nvml_dev is not None and r.nvml_dev >= 0 else -1,
                gpu_uuid=None,
                counts=dict(r.counts),
                lag=lag if r.state == RANK_OK else None,
                state=r.state,
            )
        )
    return out


@dataclass
class FollowUps:
    """When this node asks RAS again outside its turn, per job: to confirm a mismatch it saw."""

    hold_s: float = MISMATCH_HOLD_S
    due: dict[str, float] = field(default_factory=dict)  # job -> clock time of its follow-up query
    sent: int = 0  # follow-up queries sent

    def is_due(self, now: float) -> bool:
        return any(at <= now for at in self.due.values())

    def started(self, now: float) -> bool:
        """A query starts now: True when it is a follow-up (every due follow-up is then answered by it)."""
        due = [job for job, at in self.due.items() if at <= now]
        for job in due:
            del self.due[job]
        if due:
            self.sent += 1
        return bool(due)

    def answered(self, ages: Iterable[tuple[str, float]], *, follow_up: bool, at: float) -> None:
        """Plan after an answer (``at``: when its query started) from each job's out-of-step communicators' ages
        (``(job, age)``; a job absent from ``ages`` shows none)."""
        pending: dict[str, float] = {}  # job -> the oldest of its mismatches younger than the hold
        for job, age in ages:
            if age < self.hold_s:
                pending[job] = max(age, pending.get(job, age))
        for job in [j for j in self.due if j not in pending]:
            del self.due[job]  # its mismatch is gone, or has held long enough: nothing to confirm
        for job, age in pending.items():
            if age == 0.0 and follow_up:
                self.due.pop(job, None)  # a new mismatch a follow-up found (a straggler's lag): no chain
                continue
            when = at + self.hold_s - age
            self.due[job] = min(when, self.due.get(job, when))

    def forget(self, jobs: Iterable[str]) -> None:
        for job in jobs:
            self.due.pop(job, None)
