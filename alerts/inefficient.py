"""The ``JobInefficient`` rule: a job that has held its GPUs mostly idle.

Each round adds the latest readings of every job's GPUs to a running count (kept in the history's memo, carried
from round to round while the job stays): how many GPU readings it had and how many were below
``idle_utilization``. Once the job has held GPUs for ``held_s`` and the idle share reaches ``idle_ratio``, the rule
holds; it stops when the job ends or its GPUs get busy enough to bring the share down. A job that leaves for one
round starts counting again. The same share, over the job's whole life, is in its accounting summary.
"""

from __future__ import annotations

from gpulens.alerts.base import AlertRule, Candidate, percent, rule_labels
from gpulens.alerts.history import History, Round
from gpulens.config import format_duration


def job_inefficient(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    latest = history.latest
    if latest is None:
        return []
    limit, share_min, held_s = (
        rule.threshold("idle_utilization"),
        rule.threshold("idle_ratio"),
        rule.threshold("held_s"),
    )
    before, memo = history.previous_memo(), history.memo()
    out = []
    for job_id, view in latest.jobs.items():
        key = ("job_idle", job_id)
        carried = before.get(key)  # from the round before: judging a round again adds nothing
        if carried is None:  # not judged the round before: count what the window holds of the job
            n, idle, since = _count(history, job_id, limit)
        else:
            n, idle, since = carried
            counted = _count_round(latest, view.gpus, limit)
            n, idle = n + counted[0], idle + counted[1]
        memo[key] = (n, idle, since)
        if not n or now - since < held_s or idle / n < share_min:
            continue
        labels = rule_labels(rule, {"job_id": job_id, "user": view.user or ""})
        share = idle / n
        out.append(
            Candidate(
                rule.name,
                labels,
                share,
                f"job {job_id}: its {len(view.gpus)} GPU(s) idle {percent(share)} of the time over "
                f"{format_duration(now - since)}",
                f"The job's GPUs were below {percent(limit)} utilization in {percent(share)} of their readings since "
                f"it started holding them: it reserves GPUs it does not use.",
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


def _count(history: History, job_id: str, limit: float) -> tuple[int, int, float]:
    """Readings and idle readings of the job's GPUs over the unbroken run of rounds, ending with the latest, that
    list the job; and that run's first round."""
    n = idle = 0
    since = None
    for round_ in reversed(history.rounds):
        view = round_.jobs.get(job_id)
        if view is None:
            break
        counted = _count_round(round_, view.gpus, limit)
        n, idle, since = n + counted[0], idle + counted[1], round_.time
    return n, idle, since if since is not None else 0.0
