"""Replay a simulated (or recorded) cluster through the alert engine in virtual time, as fast as the CPU allows.

``rounds`` reads every node at each step, as a collector would, turning a node that cannot be read
(``NodeUnavailableError``) into a failed scrape. ``AlertTimeline`` collects which alerts fired and when they ended,
in the shape ``gpulens simulate --json`` prints; it leaves out the ``Watchdog``, which fires in every round and says
nothing about the cluster. ``replay`` ties the two to an ``AlertEngine``; with storage in the
loop, call ``rounds`` and ``AlertTimeline`` around the collector's own ingest and engine instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpulens.alerts.base import AlertRule
from gpulens.alerts.catalogue import WATCHDOG
from gpulens.alerts.engine import AlertEngine, EngineRound
from gpulens.alerts.state import FIRING, RESOLVED, StepResult
from gpulens.config import format_duration, format_timestamp
from gpulens.model import NodeSnapshot, NodeUnavailableError, TargetHealth


class SnapshotSource(Protocol):
    """What ``gpulens.exporter.sim.SimCluster`` offers: any node's snapshot at any (virtual) time."""

    def node_names(self) -> list[str]: ...

    def snapshot(self, node: str, t: float) -> NodeSnapshot: ...


def read_round(source: SnapshotSource, t: float) -> tuple[list[NodeSnapshot], list[TargetHealth]]:
    """Every node's snapshot at ``t``, and each node's scrape health (down while its exporter cannot answer)."""
    snapshots: list[NodeSnapshot] = []
    targets: list[TargetHealth] = []
    for node in source.node_names():
        try:
            snap = source.snapshot(node, t)
        except NodeUnavailableError as exc:
            targets.append(TargetHealth(node, f"sim://{node}", "gpulens", t, up=False, node=node, last_error=str(exc)))
            continue
        snapshots.append(snap)
        targets.append(TargetHealth(node, f"sim://{node}", "gpulens", t, up=True, node=node, samples=len(snap.gpus)))
    return snapshots, targets


def rounds(
    source: SnapshotSource, start: float, end: float, step_s: float
) -> Iterator[tuple[float, list[NodeSnapshot], list[TargetHealth]]]:
    """``(time, snapshots, targets)`` for each step from ``start`` up to (not including) ``end``."""
    if step_s <= 0:
        raise ValueError("step_s must be positive")
    k = 0
    while (t := start + k * step_s) < end - 1e-9:
        yield (t, *read_round(source, t))
        k += 1


@dataclass
class FiredAlert:
    """An alert that fired: when it started firing and, once resolved, when it ended."""

    fingerprint: str
    alertname: str
    severity: str
    labels: dict[str, str]
    starts_at: float
    summary: str
    ends_at: float | None = None
    # The annotations and muting when it fired (a stall a down link inhibits carries its ``cause``); not in to_json.
    annotations: dict[str, str] = field(default_factory=dict)
    muted: str | None = None

    def to_json(self) -> dict[str, Any]:
        """``{"alertname", "severity", "labels", "startsAt", "endsAt", "summary"}`` with RFC 3339 times."""
        return {
            "alertname": self.alertname,
            "severity": self.severity,
            "labels": dict(self.labels),
            "startsAt": format_timestamp(self.starts_at),
            "endsAt": None if self.ends_at is None else format_timestamp(self.ends_at),
            "summary": self.summary,
        }


@dataclass
class AlertTimeline:
    """Collects fired and resolved alerts from the engine's step results, in the order they fired (not the
    ``Watchdog``)."""

    alerts: list[FiredAlert] = field(default_factory=list)
    _open: dict[str, FiredAlert] = field(default_factory=dict)

    def observe(self, result: StepResult) -> None:
        for transition in result.transitions:
            if transition.rule == WATCHDOG:
                continue
            if transition.state == FIRING:
                state = result.states[transition.fingerprint]
                fired = FiredAlert(
                    fingerprint=transition.fingerprint,
                    alertname=transition.rule,
                    severity=state.severity,
                    labels=dict(transition.labels),
                    starts_at=transition.at,
                    summary=state.summary,
                    annotations=dict(state.annotations),
                    muted=state.muted,
                )
                self.alerts.append(fired)
                self._open[transition.fingerprint] = fired
            elif transition.state == RESOLVED and transition.fingerprint in self._open:
                self._open.pop(transition.fingerprint).ends_at = transition.at

    def to_json(self) -> list[dict[str, Any]]:
        return [a.to_json() for a in self.alerts]


def subject(labels: Mapping[str, str]) -> str:
    """What an alert is about, the way a person names it: ``node-01:3``, ``job llm-pretrain``, ``node-04``."""
    if "gpu" in labels:
        return f"{labels.get('node', '?')}:{labels['gpu']}"
    if labels.get("job_id"):
        return f"job {labels['job_id']}"
    return labels.get("node") or labels.get("target", "")


def table(alerts: Sequence[FiredAlert], origin: float) -> str:
    """A readable table of fired alerts; times are offsets from ``origin`` (the scenario's start)."""
    rows = [("FIRED", "ENDED", "ALERT", "SEVERITY", "SUBJECT", "SUMMARY")]
    for a in alerts:
        ended = "firing" if a.ends_at is None else "+" + format_duration(a.ends_at - origin)
        rows.append(
            ("+" + format_duration(a.starts_at - origin), ended, a.alertname, a.severity, subject(a.labels), a.summary)
        )
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[5] for row in rows
    )


@dataclass(frozen=True)
class ReplayReport:
    alerts: list[FiredAlert]
    rounds: int

    def to_json(self) -> list[dict[str, Any]]:
        return [a.to_json() for a in self.alerts]


def replay(
    source: SnapshotSource,
    *,
    start: float,
    end: float,
    step_s: float,
    rules: Sequence[AlertRule] | None = None,
    engine: AlertEngine | None = None,
    on_round: Callable[[EngineRound], None] | None = None,
) -> ReplayReport:
    """Run the source from ``start`` to ``end`` through an engine (``engine``, or a new one with ``rules``)."""
    if engine is None:
        if rules is None:
            raise ValueError("give rules or an engine")
        engine = AlertEngine(rules)
    timeline = AlertTimeline()
    count = 0
    for t, snapshots, targets in rounds(source, start, end, step_s):
        outcome = engine.process(t, snapshots, targets)
        timeline.observe(outcome.result)
        if on_round is not None:
            on_round(outcome)
        count += 1
    return ReplayReport(timeline.alerts, count)
