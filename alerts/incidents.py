"""Incidents: the firing alerts grouped, each round, into one verdict per fault by the causal table (pure).

``form`` takes the previous incidents (by id), the alert states after the round's ``state.step`` and ``now``, and
returns the incidents as they stand now. Alerts that explain one another (``alerts.causes``) or name the same culprit
are one incident; an alert nothing explains and that explains nothing is an incident of its own. An incident keeps
its id while any of its members stays: a cause that arrives after its effect (the stall first, the XID a round
later) re-attributes the incident, it never opens a second one. It resolves when every member has.

The verdict (``Incident``): the culprit (the lowest-layer cause: ``alerts.incidentparts.culprit_of``), the blast
radius (jobs, users, GPUs), the members with their timeline, one action in the XID catalogue's vocabulary with its
runbook, the severity (the highest member's), when its fault began, fired and ended.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from gpulens.alerts.causes import CAUSAL_TABLE, JOB_WIDE, LAYERS, NOT_FAULTS, Explains, action_rank
from gpulens.alerts.incidentparts import (
    Culprit,
    action_of,
    culprit_of,
    explains,
    jobs_of,
    split,
    users_of,
)
from gpulens.alerts.state import FIRING, RESOLVED, AlertState, cause_text
from gpulens.config import format_timestamp

OPEN: Final = "open"
CLOSED: Final = "resolved"
SEVERITIES: Final = ("critical", "warning", "info")
# How long a resolved incident stays in the engine's memory (the store keeps it for the history).
RESOLVED_KEEP_S: Final = 900.0


@dataclass(frozen=True, slots=True)
class Member:
    """One alert of an incident, and what explains it (the fingerprint of its cause; None for a root)."""

    fingerprint: str
    rule: str
    labels: Mapping[str, str]
    severity: str
    state: str  # "firing" | "resolved"
    active_since: float
    fired_at: float
    resolved_at: float | None = None
    explained_by: str | None = None
    summary: str = ""
    stuck_at: str = ""  # a stall's stuck ranks (``rank@node:gpu``, comma-separated)
    began_at: float | None = None  # when its fault began, where known before its condition held (``AlertState``)

    @property
    def began(self) -> float:
        return self.active_since if self.began_at is None else min(self.began_at, self.active_since)

    def to_json(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "rule": self.rule,
            "labels": dict(self.labels),
            "severity": self.severity,
            "state": self.state,
            "active_since": self.active_since,
            "fired_at": self.fired_at,
            "resolved_at": self.resolved_at,
            "explained_by": self.explained_by,
            "summary": self.summary,
            "stuck_at": self.stuck_at,
            "began_at": self.began_at,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Member:
        return cls(
            fingerprint=str(d["fingerprint"]),
            rule=str(d["rule"]),
            labels={str(k): str(v) for k, v in d["labels"].items()},
            severity=str(d.get("severity", "")),
            state=str(d["state"]),
            active_since=float(d["active_since"]),
            fired_at=float(d["fired_at"]),
            resolved_at=None if d.get("resolved_at") is None else float(d["resolved_at"]),
            explained_by=None if d.get("explained_by") is None else str(d["explained_by"]),
            summary=str(d.get("summary", "")),
            stuck_at=str(d.get("stuck_at", "")),
            began_at=None if d.get("began_at") is None else float(d["began_at"]),
        )


@dataclass(frozen=True, slots=True)
class Notified:
    """What the last notification of an incident said: the culprit, the blast radius and whether it was resolved."""

    culprit: str
    jobs: tuple[str, ...]
    gpus: tuple[str, ...]
    resolved: bool = False


@dataclass(frozen=True, slots=True)
class Incident:
    """One fault's verdict (see the module's docstring)."""

    id: str
    culprit: Culprit
    members: tuple[Member, ...]
    jobs: tuple[str, ...]
    users: tuple[str, ...]
    gpus: tuple[str, ...]
    action: str
    runbook: str
    severity: str
    started_at: float  # when the fault began: the earliest member's ``began``
    fired_at: float  # when the first member fired
    resolved_at: float | None = None
    notified: Notified | None = None

    @property
    def state(self) -> str:
        return CLOSED if self.resolved_at is not None else OPEN

    @property
    def is_open(self) -> bool:
        return self.resolved_at is None

    @property
    def summary(self) -> str:
        """``GPU node-02:3: XidError, GpuLost; hurts job llm (alice)``."""
        roots = sorted({m.rule for m in self.members if m.explained_by is None})
        effects = sorted({m.rule for m in self.members if m.explained_by is not None} - set(roots))
        text = f"{self.culprit.text}: {', '.join(roots)}"
        if effects:
            text += f" -> {', '.join(effects)}"
        if self.jobs:
            who = f" ({', '.join(self.users)})" if self.users else ""
            text += f"; hurts job{'s' if len(self.jobs) > 1 else ''} {', '.join(self.jobs)}{who}"
        return text

    def labels(self) -> dict[str, str]:
        """The labels each member alert carries to Alertmanager: ``incident`` and ``culprit_*``."""
        out = {"incident": self.id}
        for key, value in self.culprit.to_json().items():
            if value is not None and value != "":
                out[f"culprit_{key}"] = str(value)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state,
            "summary": self.summary,
            "culprit": self.culprit.to_json(),
            "jobs": list(self.jobs),
            "users": list(self.users),
            "gpus": list(self.gpus),
            "action": self.action,
            "runbook": self.runbook,
            "severity": self.severity,
            "started_at": self.started_at,
            "fired_at": self.fired_at,
            "resolved_at": self.resolved_at,
            "startsAt": format_timestamp(self.started_at),
            "endsAt": None if self.resolved_at is None else format_timestamp(self.resolved_at),
            "members": [m.to_json() for m in self.members],
            "notified": None
            if self.notified is None
            else {
                "culprit": self.notified.culprit,
                "jobs": list(self.notified.jobs),
                "gpus": list(self.notified.gpus),
                "resolved": self.notified.resolved,
            },
        }

    def report(self) -> dict[str, Any]:
        """The incident as ``gpulens simulate --incidents-json`` prints it (keys that do not apply are null)."""
        return {
            "id": self.id,
            "culprit": self.culprit.to_json(),
            "jobs": list(self.jobs),
            "users": list(self.users),
            "gpus": list(self.gpus),
            "alerts": [{"alertname": m.rule, "labels": dict(m.labels)} for m in self.members],
            "action": self.action,
            "severity": self.severity,
            "summary": self.summary,
            "startsAt": format_timestamp(self.fired_at),
            "faultBeganAt": format_timestamp(self.started_at),
            "endsAt": None if self.resolved_at is None else format_timestamp(self.resolved_at),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Incident:
        """Raises ``ValueError`` for a document that is not an incident."""
        try:
            n = d.get("notified")
            return cls(
                id=str(d["id"]),
                culprit=Culprit.from_json(d["culprit"]),
                members=tuple(Member.from_json(m) for m in d["members"]),
                jobs=tuple(str(j) for j in d.get("jobs", ())),
                users=tuple(str(u) for u in d.get("users", ())),
                gpus=tuple(str(g) for g in d.get("gpus", ())),
                action=str(d.get("action", "none")),
                runbook=str(d.get("runbook", "")),
                severity=str(d.get("severity", "")),
                started_at=float(d["started_at"]),
                fired_at=float(d["fired_at"]),
                resolved_at=None if d.get("resolved_at") is None else float(d["resolved_at"]),
                notified=None
                if not n
                else Notified(
                    str(n["culprit"]), tuple(n.get("jobs", ())), tuple(n.get("gpus", ())), bool(n.get("resolved"))
                ),
            )
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ValueError(f"not an incident: {exc!r:.80}") from None


# ------------------------------------------------------------------------------------------------ forming


class _Union:
    def __init__(self, items: Sequence[str]) -> None:
        self.parent = {i: i for i in items}

    def find(self, x: str) -> str:
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def join(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


# Joins in which the effect names its cause (its stuck rank's GPU, its straggling GPU): preferred to a cause that is
# merely under the same job (an XID on another GPU, a degraded port, of a job whose straggler is a throttled GPU).
NAMING_JOINS: Final = ("stuck_gpu", "named_gpu")


def _edges(alerts: Sequence[AlertState], table: Sequence[Explains] = CAUSAL_TABLE) -> dict[str, str]:
    """Effect fingerprint -> the fingerprint of the alert that explains it: one that the effect names first, then the
    lowest-layer one."""
    by_rule: dict[str, list[AlertState]] = {}
    for a in alerts:
        by_rule.setdefault(a.rule, []).append(a)
    found: dict[str, tuple[int, int, str]] = {}
    for row in table:
        specific = 0 if row.join in NAMING_JOINS else 1
        causes = [c for rule in row.causes for c in by_rule.get(rule, ()) if all(m.matches(c.labels) for m in row.when)]
        if not causes:
            continue
        effects = alerts if "*" in row.effects else [e for rule in row.effects for e in by_rule.get(rule, ())]
        for c in causes:
            layer = LAYERS.index(culprit_of(c).kind)
            for e in effects:
                if e.fingerprint == c.fingerprint or e.rule in NOT_FAULTS or not explains(row.join, c, e):
                    continue
                if "*" in row.effects and e.rule in row.causes and culprit_of(e).key == culprit_of(c).key:
                    continue  # two node faults of one node: the same culprit, merged below
                best = found.get(e.fingerprint)
                if best is None or (specific, layer) < best[:2]:
                    found[e.fingerprint] = (specific, layer, c.fingerprint)
    return {e: c for e, (_, _, c) in found.items()}


def _incident_id(first: AlertState, at: float) -> str:
    return "inc-" + hashlib.sha256(f"{first.fingerprint}@{at:.3f}".encode()).hexdigest()[:12]


def _member(a: AlertState, explained_by: str | None) -> Member:
    return Member(
        fingerprint=a.fingerprint,
        rule=a.rule,
        labels=dict(a.labels),
        severity=a.severity,
        state=RESOLVED if a.state == RESOLVED else FIRING,
        active_since=a.active_since,
        fired_at=a.fired_at if a.fired_at is not None else a.active_since,
        resolved_at=a.resolved_at,
        explained_by=explained_by,
        summary=a.summary,
        stuck_at=a.annotations.get("stuck_at", ""),
        began_at=a.began_at,
    )


def form(
    previous: Mapping[str, Incident],
    states: Mapping[str, AlertState],
    now: float,
    table: Sequence[Explains] = CAUSAL_TABLE,
) -> dict[str, Incident]:
    """The incidents after this round (see the module's docstring): open ones and those resolved within
    ``RESOLVED_KEEP_S``. ``table``: the causal table (``causes.table``: the builtin rows and the config's)."""
    firing = sorted(
        (s for s in states.values() if s.state == FIRING and s.rule not in NOT_FAULTS), key=lambda s: s.fingerprint
    )
    edges = _edges(firing, table)
    union = _Union([s.fingerprint for s in firing])
    for effect, cause in edges.items():
        union.join(effect, cause)
    by_culprit: dict[str, str] = {}
    for s in firing:  # one culprit, one incident; a job's own load on several of its parts, one incident
        keys = [culprit_of(s).key]
        if s.rule in JOB_WIDE and s.labels.get("job_id"):
            keys.append(f"load/{s.rule}/{s.labels['job_id']}")
        for key in keys:
            if key in by_culprit:
                union.join(s.fingerprint, by_culprit[key])
            else:
                by_culprit[key] = s.fingerprint
    groups: dict[str, list[AlertState]] = {}
    for s in firing:
        groups.setdefault(union.find(s.fingerprint), []).append(s)
    owner = {m.fingerprint: inc.id for inc in previous.values() if inc.is_open for m in inc.members}
    out: dict[str, Incident] = {}
    taken: set[str] = set()
    for members in groups.values():
        before = sorted(
            {owner[m.fingerprint]: previous[owner[m.fingerprint]] for m in members if m.fingerprint in owner}.values(),
            key=lambda i: (i.started_at, i.id),
        )
        keep = next((i for i in before if i.id not in out), None)  # an incident that split: the first part keeps it
        merged = {m.fingerprint: m for inc in before for m in inc.members} if keep is not None else {}
        for s in members:
            prior = merged.get(s.fingerprint)
            explained = edges.get(s.fingerprint) or (prior.explained_by if prior else None)
            merged[s.fingerprint] = _member(s, explained)
        current = {s.fingerprint for s in members}
        for fp, m in list(merged.items()):  # members that left the firing set: their latest state
            if fp not in current:
                merged[fp] = _refresh(m, states.get(fp), now)
        incident_id = keep.id if keep else _incident_id(min(members, key=_order), min(s.active_since for s in members))
        taken.update(i.id for i in before)
        out[incident_id] = _verdict(incident_id, list(merged.values()), states, keep, None)
    for inc in previous.values():
        if inc.id in taken or inc.id in out:
            continue
        if inc.is_open:
            left = [_refresh(m, states.get(m.fingerprint), now) for m in inc.members]
            resolved_at = max((m.resolved_at or now) for m in left)
            out[inc.id] = _verdict(inc.id, left, states, inc, resolved_at)
        elif inc.resolved_at is not None and now - inc.resolved_at < RESOLVED_KEEP_S:
            out[inc.id] = inc
    return out


def _order(s: AlertState) -> tuple[float, int, str]:
    return (s.fired_at or s.active_since, LAYERS.index(culprit_of(s).kind), s.fingerprint)


def _refresh(m: Member, state: AlertState | None, now: float) -> Member:
    """A member no longer firing: resolved (when its alert says so, or now when its alert is gone)."""
    if m.state == RESOLVED:
        return m
    if state is not None and state.state == FIRING:
        return replace(m, state=FIRING)
    at = state.resolved_at if state is not None and state.resolved_at is not None else now
    return replace(m, state=RESOLVED, resolved_at=at)


def _verdict(
    incident_id: str,
    members: list[Member],
    states: Mapping[str, AlertState],
    before: Incident | None,
    resolved_at: float | None,
) -> Incident:
    members.sort(key=lambda m: (m.fired_at, m.rule, m.fingerprint))
    firing_roots = [m for m in members if m.explained_by is None and m.state == FIRING]
    roots = firing_roots or [m for m in members if m.explained_by is None] or members
    culprits = [(culprit_of(states.get(m.fingerprint) or m), m) for m in roots]
    culprit, _ = min(culprits, key=lambda cm: (LAYERS.index(cm[0].kind), _severity(cm[1].severity), cm[1].fired_at))
    if before is not None and not firing_roots:
        culprit = before.culprit  # nothing fires: the verdict stands as it was
    elif len({c.key for c, _ in culprits}) > 1 and all(m.rule in JOB_WIDE for _, m in culprits):
        jobs = {m.labels.get("job_id") for _, m in culprits}
        if len(jobs) == 1 and (job := jobs.pop()):
            culprit = Culprit("job", job_id=job)  # the job's own load on several of its GPUs or ports
    at_culprit = [m for c, m in culprits if c.key == culprit.key] or roots
    action = max((action_of(m.rule, m.labels) for m in at_culprit), key=action_rank)
    lead = next((m for m in at_culprit if action_of(m.rule, m.labels) == action), at_culprit[0])
    lead_state = states.get(lead.fingerprint)
    runbook = lead_state.annotations.get("runbook", "") if lead_state is not None else ""
    if not runbook and before is not None:
        runbook = before.runbook
    return Incident(
        id=incident_id,
        culprit=culprit,
        members=tuple(members),
        jobs=jobs_of(members, culprit),
        users=users_of(members),
        gpus=tuple(sorted({f"{m.labels['node']}:{m.labels['gpu']}" for m in members if "gpu" in m.labels})),
        action=action,
        runbook=runbook,
        severity=min((m.severity for m in members), key=_severity),
        started_at=min(m.began for m in members),
        fired_at=min(m.fired_at for m in members),
        resolved_at=resolved_at,
        notified=before.notified if before is not None else None,
    )


def _severity(s: str) -> int:
    return SEVERITIES.index(s) if s in SEVERITIES else len(SEVERITIES)


def annotate(states: dict[str, AlertState], incidents: Mapping[str, Incident]) -> None:
    """Mark each member alert with its incident (``incident`` annotation) and each explained one with its
    ``cause`` (the alert that explains it, as ``state.cause_text`` names it), in place."""
    for inc in incidents.values():
        for m in inc.members:
            s = states.get(m.fingerprint)
            if s is None:
                continue
            notes = dict(s.annotations)
            notes["incident"] = inc.id
            cause = states.get(m.explained_by) if m.explained_by else None
            if cause is not None:
                said, text = notes.get("cause", ""), cause_text(cause)
                notes["cause"] = said if said.startswith(text) else f"{text}: {said}" if said else text
            if notes != s.annotations:
                states[m.fingerprint] = replace(s, annotations=notes)


def open_incidents(incidents: Mapping[str, Incident]) -> list[Incident]:
    """The open incidents, the most severe first, then the oldest."""
    return sorted((i for i in incidents.values() if i.is_open), key=lambda i: (_severity(i.severity), i.fired_at, i.id))


__all__ = ["Culprit", "Incident", "Member", "Notified", "annotate", "form", "open_incidents", "split"]
