"""Job flags (stalled, straggling, idle) and marked periods, read from the alert engine's alerts (pure).

The alert engine decides what a stall or a straggler is (docs/domain.md); the dashboard only shows its verdict,
so the Jobs page and the alerts never disagree.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Final, Protocol

from gpulens.dashboard.figures.periods import Period

# Alert name -> the flag it raises on its job, and the kind of period it marks on the job's charts.
JOB_FLAGS: Final = {"CommunicationStall": "stalled", "JobStraggler": "straggling", "GpuIdleAllocated": "idle"}
PERIOD_KINDS: Final = {"CommunicationStall": "stall", "JobStraggler": "straggler", "GpuIdleAllocated": "idle"}
FLAG_ORDER: Final = ("stalled", "straggling", "idle")


class AlertLike(Protocol):
    """What the flags need of an alert (storage's alert records have it)."""

    @property
    def rule(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def labels(self) -> Mapping[str, str]: ...


class EpisodeLike(AlertLike, Protocol):
    @property
    def active_since(self) -> float: ...

    @property
    def fired_at(self) -> float | None: ...

    @property
    def resolved_at(self) -> float | None: ...


def alert_jobs(labels: Mapping[str, str]) -> list[str]:
    """The job ids an alert is about (a GPU held by two notebooks carries ``job_id="a,b"``)."""
    return [j for j in labels.get("job_id", "").split(",") if j]


def job_flags(alerts: Iterable[AlertLike]) -> dict[str, set[str]]:
    """job_id -> its flags, from the alerts firing now."""
    flags: dict[str, set[str]] = defaultdict(set)
    for alert in alerts:
        flag = JOB_FLAGS.get(alert.rule)
        if flag is None or alert.state != "firing":
            continue
        for job in alert_jobs(alert.labels):
            flags[job].add(flag)
    return dict(flags)


def range_flags(active: Iterable[AlertLike], episodes: Iterable[EpisodeLike]) -> dict[str, dict[str, bool]]:
    """job_id -> flag -> whether it is raised now: the flags of the alerts firing now, and those of every episode
    that fired in the range shown and has resolved since (a stall that ended a minute ago still flags its job)."""
    out: dict[str, dict[str, bool]] = defaultdict(dict)
    for job, now_flags in job_flags(active).items():
        for raised in now_flags:
            out[job][raised] = True
    for episode in episodes:
        name = JOB_FLAGS.get(episode.rule)
        if name is None or episode.fired_at is None:
            continue
        for job in alert_jobs(episode.labels):
            out[job].setdefault(name, False)
    return dict(out)


def job_periods(episodes: Iterable[EpisodeLike], job_id: str, *, now: float) -> list[Period]:
    """The stall, straggler and idle periods of one job: from when the condition of each of its alerts that fired
    began to hold (the alert's ``for`` delays only the firing) until it resolved, or now.

    A GPU-scoped alert (idle, straggler) names its GPU in the label, as ``straggler node-01:3``.
    """
    periods = []
    for episode in episodes:
        kind = PERIOD_KINDS.get(episode.rule)
        if kind is None or episode.fired_at is None or job_id not in alert_jobs(episode.labels):
            continue
        where = episode.labels.get("node", "")
        if "gpu" in episode.labels and where:
            where += f":{episode.labels['gpu']}"
        label = f"{kind} {where}".strip() if kind != "stall" else "stall"
        periods.append(Period(episode.active_since, episode.resolved_at or now, kind, label))
    return _merge(periods)


def _merge(periods: list[Period]) -> list[Period]:
    """Overlapping periods of the same label become one (an alert that re-fired after a blip)."""
    merged: list[Period] = []
    for p in sorted(periods, key=lambda p: (p.label, p.start)):
        last = merged[-1] if merged else None
        if last is not None and last.label == p.label and p.start <= last.end:
            merged[-1] = Period(last.start, max(last.end, p.end), last.kind, last.label)
        else:
            merged.append(p)
    return sorted(merged, key=lambda p: p.start)
