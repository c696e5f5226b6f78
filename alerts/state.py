"""The alert state machine (pure): inactive -> pending -> firing -> resolved, with ``for`` and ``keep_firing_for``.

``step`` takes the previous states (keyed by fingerprint), this round's candidates and ``now``, and returns the new
states and what changed. It also applies inhibition (a firing ``ExporterDown`` mutes its node's other alerts, a firing
``GpuLost`` its GPU's; what explains what is the incident layer's, ``alerts.incidents``) and silences: a muted
alert keeps its state, but its transitions carry ``muted`` and are not notified. Nothing here reads a clock or a
database; storage persists the states so that a restarted collector neither forgets a firing alert nor notifies it
again.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from gpulens.alerts.base import AlertRule, Candidate, dashboard_link
from gpulens.alerts.catalogue import EXPORTER_DOWN, GPU_LOST
from gpulens.alerts.matchers import Matcher, matchers_from_json, matchers_to_json
from gpulens.config import format_timestamp

PENDING: Final = "pending"
FIRING: Final = "firing"
RESOLVED: Final = "resolved"
INACTIVE: Final = "inactive"  # a transition only: a pending alert whose condition cleared before it fired
STATES: Final = (PENDING, FIRING, RESOLVED)

# How long a resolved alert is kept, so that its resolution can still be grouped and notified.
RESOLVED_RETENTION_S: Final = 900.0


def fingerprint(labels: Mapping[str, str]) -> str:
    """A stable identity for a label set: the first 16 hex digits of the SHA-256 of its sorted pairs."""
    digest = hashlib.sha256()
    for key in sorted(labels):
        digest.update(key.encode())
        digest.update(b"\x00")
        digest.update(labels[key].encode())
        digest.update(b"\x01")
    return digest.hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class AlertState:
    """One alert (a rule and a label set) and where it stands."""

    fingerprint: str
    rule: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    state: str  # "pending" | "firing" | "resolved"
    active_since: float  # when the condition began to hold (the start of pending)
    fired_at: float | None = None
    resolved_at: float | None = None
    last_seen: float = 0.0  # the last round in which the condition held
    value: float | None = None
    muted: str | None = None  # "silenced" | "inhibited" while muted
    began_at: float | None = None  # when the fault began, where known before the condition held (a hang's start)

    @property
    def began(self) -> float:
        """When the fault began: what the detector saw (a stall's first stalled round), else when the condition
        first held (a threshold rule's first sample past its threshold)."""
        return self.active_since if self.began_at is None else min(self.began_at, self.active_since)

    @property
    def severity(self) -> str:
        return self.labels.get("severity", "")

    @property
    def summary(self) -> str:
        return self.annotations.get("summary", "")

    def to_json(self) -> dict[str, Any]:
        """A JSON object of the state (outbox payloads, storage); ``from_json`` reads it back."""
        return {
            "fingerprint": self.fingerprint,
            "rule": self.rule,
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "state": self.state,
            "active_since": self.active_since,
            "fired_at": self.fired_at,
            "resolved_at": self.resolved_at,
            "last_seen": self.last_seen,
            "value": self.value,
            "muted": self.muted,
            "began_at": self.began_at,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AlertState:
        """Raises ``ValueError`` for a document that is not an alert state."""
        try:
            labels = {str(k): str(v) for k, v in data["labels"].items()}
            state = str(data["state"])
            if state not in STATES:
                raise ValueError(f"unknown state {state!r}")
            return cls(
                fingerprint=str(data.get("fingerprint") or fingerprint(labels)),
                rule=str(data["rule"]),
                labels=labels,
                annotations={str(k): str(v) for k, v in data.get("annotations", {}).items()},
                state=state,
                active_since=float(data["active_since"]),
                fired_at=_optional_float(data.get("fired_at")),
                resolved_at=_optional_float(data.get("resolved_at")),
                last_seen=float(data.get("last_seen") or data["active_since"]),
                value=_optional_float(data.get("value")),
                muted=None if data.get("muted") is None else str(data["muted"]),
                began_at=_optional_float(data.get("began_at")),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not an alert state: {exc!r:.80}") from None


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True, slots=True)
class Transition:
    """An alert entering a state this round (for the alert history and for notifications)."""

    fingerprint: str
    rule: str
    labels: Mapping[str, str]
    state: str  # "pending" | "firing" | "resolved" | "inactive"
    at: float
    value: float | None
    muted: bool = False
    began_at: float | None = None  # the alert's ``began_at`` (stored with the history, so a rebuilt episode keeps it)


@dataclass(frozen=True)
class StepResult:
    states: dict[str, AlertState]  # every alert that exists after this round, by fingerprint
    transitions: list[Transition]
    removed: list[str]  # fingerprints that existed before and are gone now

    @property
    def notifications(self) -> list[Transition]:
        """The transitions to notify: firing and resolved ones that are not muted."""
        return [t for t in self.transitions if t.state in (FIRING, RESOLVED) and not t.muted]


# ------------------------------------------------------------------------------------------------ silences


@dataclass(frozen=True)
class Silence:
    """Mutes the alerts whose labels match every matcher, from ``starts_at`` until ``ends_at``."""

    id: str
    matchers: tuple[Matcher, ...]
    starts_at: float
    ends_at: float
    comment: str = ""
    created_by: str = ""

    def active(self, now: float) -> bool:
        return self.starts_at <= now < self.ends_at

    def matches(self, labels: Mapping[str, str]) -> bool:
        return bool(self.matchers) and all(m.matches(labels) for m in self.matchers)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "matchers": matchers_to_json(self.matchers),
            "starts_at": self.starts_at,
            "ends_at": self.ends_at,
            "comment": self.comment,
            "created_by": self.created_by,
            "starts": format_timestamp(self.starts_at),
            "ends": format_timestamp(self.ends_at),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Silence:
        return cls(
            id=str(data["id"]),
            matchers=matchers_from_json(data["matchers"]),
            starts_at=float(data["starts_at"]),
            ends_at=float(data["ends_at"]),
            comment=str(data.get("comment", "")),
            created_by=str(data.get("created_by", "")),
        )


def silencer(silences: Iterable[Silence], now: float) -> Callable[[Mapping[str, str]], bool]:
    """The ``silenced`` predicate of ``step`` for the silences active at ``now``."""
    active = [s for s in silences if s.active(now)]
    return lambda labels: any(s.matches(labels) for s in active)


# ------------------------------------------------------------------------------------------------ inhibition


@dataclass(frozen=True)
class Inhibition:
    """A firing ``source`` alert mutes every other alert whose ``equal`` labels have the same values.

    With ``targets``, only alerts of those rules. A source label that lists several values (comma-separated: a port
    whose GPUs two jobs hold) matches each of them. With ``cause``, the muted alert is annotated ``cause`` with the
    source (``IbLinkDown node-03 mlx5_2``): it still shows, marked as caused by the source, but is not notified on
    its own; the source's notification is the one that pages.
    """

    source: str
    equal: tuple[str, ...]
    targets: tuple[str, ...] = ()
    cause: bool = False


# What explains what (a link down under a job's stall, an XID under its dead rank) is the incident layer's causal
# table (``alerts.causes``), not an inhibition: the explained alert is annotated with its ``cause`` and notified as
# part of its incident.
DEFAULT_INHIBITIONS: Final = (
    Inhibition(EXPORTER_DOWN, ("node",)),
    Inhibition(GPU_LOST, ("uuid",)),
)


def cause_text(source: AlertState) -> str:
    """``IbLinkDown node-03 mlx5_2``: a source alert the way a muted alert's ``cause`` names it."""
    labels = source.labels
    parts = [source.rule, *(labels[k] for k in ("node", "device") if labels.get(k))]
    if labels.get("device") and labels.get("port") not in (None, "", "1"):
        parts.append(f"port {labels['port']}")
    if not labels.get("node") and labels.get("uuid"):
        parts.append(labels["uuid"])
    return " ".join(parts)


def join_causes(causes: Sequence[str]) -> str:
    """Causes joined by ``; ``, those of one rule on one node as one: ``IbLinkDown node-00 mlx5_0,mlx5_1``."""
    grouped: dict[str, list[str]] = {}
    for cause in causes:
        parts = cause.split(" ", 2)
        head, rest = (" ".join(parts[:2]), parts[2]) if len(parts) == 3 else (cause, "")
        grouped.setdefault(head, [])
        if rest:
            grouped[head].append(rest)
    return "; ".join(f"{head} {','.join(rest)}" if rest else head for head, rest in grouped.items())


def _inhibitor(
    states: Iterable[AlertState], inhibitions: Sequence[Inhibition]
) -> Callable[[AlertState], list[str] | None]:
    """For an alert: ``None`` when nothing inhibits it, else the causes to annotate it with (maybe none)."""
    keys: dict[tuple[int, tuple[str, ...]], list[str]] = {}
    for i, rule in enumerate(inhibitions):
        for s in states:
            if s.rule == rule.source and s.state == FIRING and all(s.labels.get(k) for k in rule.equal):
                values = [s.labels[k].split(",") for k in rule.equal]
                for combo in itertools.product(*values):
                    keys.setdefault((i, combo), []).append(cause_text(s))

    def inhibited(state: AlertState) -> list[str] | None:
        found: list[str] | None = None
        for i, rule in enumerate(inhibitions):
            if state.rule == rule.source or (rule.targets and state.rule not in rule.targets):
                continue
            if not all(state.labels.get(k) for k in rule.equal):
                continue
            causes = keys.get((i, tuple(state.labels[k] for k in rule.equal)))
            if causes is not None:
                found = found or []
                if rule.cause:
                    found += [c for c in causes if c not in found]
        return found

    return inhibited


# ------------------------------------------------------------------------------------------------ the step


def _never(*_: object) -> bool:
    return False


@dataclass(frozen=True)
class _Round:
    rules: Mapping[str, AlertRule]
    now: float
    held: Callable[[str, Mapping[str, str]], bool]
    holds: list[Candidate] = field(default_factory=list)
    dashboard_url: str | None = None
    resolved_retention_s: float = RESOLVED_RETENTION_S
    _holds_by_rule: dict[str, list[Candidate]] = field(default_factory=dict, compare=False, repr=False)

    def is_held(self, state: AlertState) -> bool:
        if self.held(state.rule, state.labels):
            return True
        return any(all(state.labels.get(k) == v for k, v in c.labels.items()) for c in self._holds_of(state.rule))

    def _holds_of(self, rule: str) -> Sequence[Candidate]:
        """The holding candidates of one rule (indexed on first use: a round may hold many)."""
        by_rule = self._holds_by_rule
        if not by_rule and self.holds:
            for c in self.holds:
                by_rule.setdefault(c.rule, []).append(c)
        return by_rule.get(rule, ())


def step(
    previous: Mapping[str, AlertState],
    candidates: Sequence[Candidate],
    rules: Mapping[str, AlertRule],
    now: float,
    *,
    silenced: Callable[[Mapping[str, str]], bool] = _never,
    held: Callable[[str, Mapping[str, str]], bool] = _never,
    inhibitions: Sequence[Inhibition] = DEFAULT_INHIBITIONS,
    dashboard_url: str | None = None,
    resolved_retention_s: float = RESOLVED_RETENTION_S,
) -> StepResult:
    """Advance every alert by one evaluation round.

    ``held(rule, labels)`` is true for alerts that cannot be judged this round (their node did not answer, their GPU
    is lost): they keep their state unchanged, as do alerts matched by a candidate with ``hold`` set.
    """
    ctx = _Round(rules, now, held, [c for c in candidates if c.hold], dashboard_url, resolved_retention_s)
    active: dict[str, Candidate] = {}
    for c in candidates:
        if not c.hold and c.rule in rules:
            active.setdefault(fingerprint(c.labels), c)
    states: dict[str, AlertState] = {}
    for fp, c in active.items():
        states[fp] = _advance(previous.get(fp), fp, c, ctx)
    for fp, prev in previous.items():
        if fp not in active and (kept := _without_candidate(prev, ctx)) is not None:
            states[fp] = kept
    states = _mute(states, silenced, inhibitions)
    transitions = _transitions(previous, states, now)
    removed = [fp for fp in previous if fp not in states]
    return StepResult(states, transitions, removed)


# A rule without advice of its own (a user rule that gives no ``runbook`` annotation).
NO_ADVICE: Final = "No advice is recorded for this rule: see its definition in the alerting config."


def _annotations(c: Candidate, rule: AlertRule, dashboard_url: str | None) -> dict[str, str]:
    # the rule's own (a builtin's site overrides: runbook_url, ...), then the candidate's (a user rule's templates)
    annotations = {"summary": c.summary, "description": c.description, **rule.annotations, **c.annotations}
    annotations.setdefault("runbook", rule.action or NO_ADVICE)
    link = dashboard_link(dashboard_url, c.labels, rule.scope)
    if link:
        annotations["dashboard"] = link
    return annotations


def _advance(prev: AlertState | None, fp: str, c: Candidate, ctx: _Round) -> AlertState:
    """The alert whose condition holds this round."""
    rule = ctx.rules[c.rule]
    now = ctx.now
    annotations = _annotations(c, rule, ctx.dashboard_url)
    if prev is None or prev.state == RESOLVED:
        wait = rule.for_s if c.for_s is None else c.for_s
        firing = wait <= 0
        return AlertState(
            fingerprint=fp,
            rule=c.rule,
            labels=dict(c.labels),
            annotations=annotations,
            state=FIRING if firing else PENDING,
            active_since=now,
            fired_at=now if firing else None,
            last_seen=now,
            value=c.value,
            began_at=None if c.began is None else min(c.began, now),
        )
    if prev.state == PENDING and now - prev.active_since >= (rule.for_s if c.for_s is None else c.for_s):
        return replace(prev, state=FIRING, fired_at=now, last_seen=now, value=c.value, annotations=annotations)
    return replace(prev, last_seen=now, value=c.value, annotations=annotations)


def _without_candidate(prev: AlertState, ctx: _Round) -> AlertState | None:
    """The alert whose condition does not hold this round; ``None`` when it ceases to exist."""
    rule = ctx.rules.get(prev.rule)
    now = ctx.now
    if prev.state == RESOLVED:
        resolved_at = prev.resolved_at if prev.resolved_at is not None else now
        return prev if now - resolved_at < ctx.resolved_retention_s else None
    if rule is not None and ctx.is_held(prev):
        return prev
    if prev.state == PENDING:
        return None
    if rule is not None and now - prev.last_seen < rule.keep_firing_for_s:
        return prev
    return replace(prev, state=RESOLVED, resolved_at=now)


def _mute(
    states: dict[str, AlertState],
    silenced: Callable[[Mapping[str, str]], bool],
    inhibitions: Sequence[Inhibition],
) -> dict[str, AlertState]:
    inhibited = _inhibitor(states.values(), inhibitions)
    out = {}
    for fp, s in states.items():
        causes = inhibited(s)
        muted = "silenced" if silenced(s.labels) else "inhibited" if causes is not None else None
        annotations = s.annotations
        cause = join_causes(causes or [])
        if cause and annotations.get("cause") != cause:
            annotations = {**annotations, "cause": cause}
        out[fp] = (
            s if s.muted == muted and annotations is s.annotations else replace(s, muted=muted, annotations=annotations)
        )
    return out


def _transitions(previous: Mapping[str, AlertState], states: Mapping[str, AlertState], now: float) -> list[Transition]:
    out = []
    for fp, s in states.items():
        before = previous.get(fp)
        if before is None or before.state != s.state:
            out.append(Transition(fp, s.rule, s.labels, s.state, now, s.value, s.muted is not None, s.began_at))
    for fp, before in previous.items():
        if fp not in states and before.state == PENDING:
            out.append(
                Transition(fp, before.rule, before.labels, INACTIVE, now, before.value, before.muted is not None)
            )
    return out
