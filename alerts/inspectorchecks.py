"""JobCommunicationSlow: a job's collectives move data more slowly than they did, by NCCL's own measure.

The nodes' agents read NCCL's Inspector (``gpulens.ncclinspect``): per job, communicator, collective and size class,
the bus bandwidth each node's ranks achieved. One definition of the condition, ``slow_collectives``, over the
History's window of rounds (each node's newest view):

- *now*: the highest bandwidth any node of the job measured in the newest round that measured the key, within
  ``HOLD_S`` (a job between collectives for a moment, a checkpoint's first minute, keeps its state; the agent
  likewise keeps a series 300 s);
- *baseline*: the highest any node measured in any round of the window (30 minutes), the job's own best;
- it holds when the key has been measured for ``baseline_s`` at least (its first round in the window is that old:
  a duration, so an engine evaluating every minute and one every 10 s agree) and *now* is below ``bandwidth_ratio``
  of the baseline.

A collective is synchronous: every rank waits for the slowest link, so every node of the job measures about the
same. Where one node measured less than the others (its ranks sit beside the slow port, or wait for a straggler),
the alert names it with its slowest GPU; that is the per-rank data's word, not proof. A key no node measures in the
latest round (a checkpoint, the job's end) is not judged. The exported PromQL says the same with
``max by (job_id, comm, collective, size)`` and ``max_over_time(...[30m])``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from gpulens.alerts.base import AlertRule, Candidate, rule_labels
from gpulens.alerts.history import History
from gpulens.ncclinspect import InspectorSeries, InspectorView

Key = tuple[str, str, str, str]  # job_id, comm, collective, size
HOLD_S: Final = 120.0
# A rank measuring less than this share of the fastest node's bandwidth stands apart: the alert names where it sits.
APART: Final = 0.9


@dataclass(frozen=True, slots=True)
class SlowCollective:
    key: Key
    now: float  # bytes/s: the fastest node's measure this round
    baseline: float  # bytes/s: the job's best over the window
    measured_s: float  # since the window's first round that measured the key
    slowest: tuple[str, InspectorSeries] | None  # the node of the slowest rank and its series, where it stands apart


def _by_key(views: Mapping[str, InspectorView]) -> dict[Key, dict[str, InspectorSeries]]:
    out: dict[Key, dict[str, InspectorSeries]] = {}
    for node, view in views.items():
        for s in view.series:
            if s.job_id:
                out.setdefault((s.job_id, s.comm, s.collective, s.size), {})[node] = s
    return out


def _slowest_rank(s: InspectorSeries) -> float:
    return s.slowest_bus_bytes_per_second if s.slowest_bus_bytes_per_second is not None else s.bus_bytes_per_second


def slow_collectives(history: History, ratio: float, baseline_s: float) -> list[SlowCollective]:
    """The keys whose bandwidth this round is below ``ratio`` of the job's best over the window."""
    latest = history.latest
    if latest is None:
        return []
    current: dict[Key, dict[str, InspectorSeries]] = {}
    best: dict[Key, float] = {}
    first: dict[Key, float] = {}
    for round_ in reversed(history.rounds):
        if not round_.inspector:
            continue
        recent = latest.time - round_.time <= HOLD_S
        for key, nodes in _by_key(round_.inspector).items():
            if key not in current:
                if not recent:
                    continue
                current[key] = nodes
            top = max(s.bus_bytes_per_second for s in nodes.values())
            best[key] = max(best.get(key, 0.0), top)
            first[key] = round_.time  # rounds newest first: the last one set is the oldest
    out = []
    for key, nodes in sorted(current.items()):
        now = max(s.bus_bytes_per_second for s in nodes.values())
        baseline = best.get(key, 0.0)
        measured = latest.time - first.get(key, latest.time)
        if measured < baseline_s or baseline <= 0 or now >= ratio * baseline:
            continue
        low = min(nodes.items(), key=lambda kv: (_slowest_rank(kv[1]), kv[0]))
        slowest = low if _slowest_rank(low[1]) < APART * now else None
        out.append(SlowCollective(key, now, baseline, measured, slowest))
    return out


def job_communication_slow(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    out = []
    for slow in slow_collectives(history, rule.threshold("bandwidth_ratio"), rule.threshold("baseline_s")):
        job_id, comm, collective, size = slow.key
        labels = rule_labels(rule, {"job_id": job_id, "comm": comm, "collective": collective, "size": size})
        share = slow.now / slow.baseline
        where = ""
        if slow.slowest is not None:
            node, series = slow.slowest
            gpu = f", GPU {series.slowest_gpu}" if series.slowest_gpu else ""
            rank = f" (rank {series.slowest_rank}{gpu})" if series.slowest_rank is not None else ""
            where = f" The slowest ranks sit on {node}{rank}: look at its links first."
        summary = (
            f"job {job_id}: {collective} of {size} on communicator {comm} at {share:.0%} of its bus bandwidth "
            f"({slow.now / 1e9:.1f} of {slow.baseline / 1e9:.1f} GB/s)"
        )
        description = (
            f"NCCL's Inspector measures {collective} messages of {size} on communicator {comm} of job {job_id} at "
            f"{slow.now / 1e9:.1f} GB/s bus bandwidth, {share:.0%} of the job's best of the last "
            f"{history.window_s / 60:.0f} minutes ({slow.baseline / 1e9:.1f} GB/s).{where}"
        )
        out.append(Candidate(rule.name, labels, round(share, 4), summary, description))
    return out
