"""The ``JobInefficient`` rule: a job that holds its GPUs mostly idle.

The condition holds while, over the rounds of the history's window that list the job, its GPUs' readings were below
``idle_utilization`` in at least ``idle_ratio`` of them; the rule's ``for`` (30 minutes) makes it "for half an hour
on end". Each job's per-round counts are kept in the history's memo and carried from round to round (the oldest
dropped as they leave the window), so a round costs one pass over the job's GPUs; a job not judged the round before
is counted again from the window. The condition can be judged from the first round after a collector restart, so the
alert's pending time, stored with its state, carries on. The job's accounting summary gives the same share over its
whole life.
"""

from __future__ import annotations

from collections import deque

from gpulens.alerts.base import AlertRule, Candidate, percent, rule_labels
from gpulens.alerts.history import History, Round


class _Counts:
    """A job's per-round counts over the window, oldest first, with their running totals (a round adds and drops
    its counts instead of summing the window again: the window holds hundreds of rounds)."""

    __slots__ = ("idle", "n", "rounds")

    def __init__(self) -> None:
        self.rounds: deque[tuple[float, int, int]] = deque()  # (round time, readings, idle readings)
        self.n = self.idle = 0

    def append(self, time: float, n: int, idle: int) -> None:
        self.rounds.append((time, n, idle))
        self.n += n
        self.idle += idle

    def appendleft(self, time: float, n: int, idle: int) -> None:
        self.rounds.appendleft((time, n, idle))
        self.n += n
        self.idle += idle

    def drop_before(self, horizon: float) -> None:
        while self.rounds and self.rounds[0][0] < horizon:
            _, n, idle = self.rounds.popleft()
            self.n -= n
            self.idle -= idle


def job_inefficient(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    latest = history.latest
    if latest is None:
        return []
    limit, share_min = rule.threshold("idle_utilization"), rule.threshold("idle_ratio")
    before, memo = history.previous_memo(), history.memo()
    horizon = latest.time - history.window_s
    out = []
    for job_id, view in latest.jobs.items():
        key = ("job_idle", job_id, limit)
        counts: _Counts | None = before.get(key)
        if counts is None or not counts.rounds:
            counts = _from_window(history, job_id, limit)
        elif counts.rounds[-1][0] != latest.time:
            counts.append(latest.time, *_count_round(latest, view.gpus, limit))
        counts.drop_before(horizon)
        memo[key] = counts
        n, idle = counts.n, counts.idle
        if not n or idle / n < share_min:
            continue
        share = idle / n
        labels = rule_labels(rule, {"job_id": job_id, "user": view.user or ""})
        out.append(
            Candidate(
                rule.name,
                labels,
                share,
                f"job {job_id}: its {len(view.gpus)} GPU(s) idle {percent(share)} of the time",
                f"The job's GPUs were below {percent(limit)} utilization in {percent(share)} of their readings: it "
                "reserves GPUs it does not use.",
            )
        )
    return out


def _count_round(round_: Round, gpus: tuple[str, ...], limit: float) -> tuple[int, int]:
    """The round's readings of ``gpus`` with a utilization, and those below ``limit``."""
    n = idle = 0
    for uuid in gpus:
        reading = round_.gpus.get(uuid)
        if reading is not None and reading.up and reading.utilization_ratio is not None:
            n += 1
            idle += reading.utilization_ratio < limit
    return n, idle


def _from_window(history: History, job_id: str, limit: float) -> _Counts:
    """The counts of the unbroken run of rounds, ending with the latest, that list the job."""
    counts = _Counts()
    for round_ in reversed(history.rounds):
        view = round_.jobs.get(job_id)
        if view is None:
            break
        counts.appendleft(round_.time, *_count_round(round_, view.gpus, limit))
    return counts
