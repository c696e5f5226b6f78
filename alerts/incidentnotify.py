"""Incident notifications (pure): what the engine sends to Slack, webhook and log receivers and to the actions.

Routes whose receiver takes incidents (``Route.incidents``) get no member alert on its own: an incident goes to the
routes that any of its (unsilenced) members matches, once when it opens, and again only when its culprit changes,
its blast radius (jobs or GPUs) grows, or it resolves; one that resolved before it was ever told is told once,
resolved. A single incident's message is a ``Notification`` whose ``group_key`` is ``incident:<id>`` and whose group
labels carry the verdict (``incident``, ``culprit_*`` and ``incident_*``: summary, jobs, users, action, runbook,
link), with the member alerts as its alerts.

Message receivers (``Route.batch``: Slack, webhook and log) get one message a round however many incidents are due:
the incidents are one Alertmanager-like group (``BATCH_KEY`` in the engine's groups, so a restart keeps it). The
first event waits the routes' ``group_wait`` (so a cause a round behind its effect is in the first message, and
faults that start together arrive together); while any incident is open, what changed is then sent every
``group_interval``. A message about several incidents has ``group_key`` ``incidents:<id>,<id>...``, group labels
``{"incidents": "<id>,<id>..."}``, each verdict in ``Notification.incidents`` and every member alert (each labelled
with its incident). Actions (``Route.incidents`` without ``batch``) get one message per incident at once.

Routes to Alertmanager receivers keep the grouper (``alerts.grouping``): every member alert goes with the
``incident`` and ``culprit_*`` labels (``labelled``), so that Alertmanager's ``group_by: [incident]`` groups alike;
when those labels change (a re-attribution), the old label set is withdrawn (``withdrawn``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Final

from gpulens.alerts.grouping import Grouper, GroupState, Notification, Route
from gpulens.alerts.incidents import Incident, Notified
from gpulens.alerts.state import FIRING, RESOLVED, AlertState
from gpulens.config import format_timestamp

INCIDENTS_PATH = "/incidents"
# The message receivers' incident group in the engine's notification groups.
BATCH_KEY: Final = "incidents"


def labelled(states: Iterable[AlertState], incidents: Mapping[str, Incident]) -> list[AlertState]:
    """The alert states with their incident's labels added (fingerprints unchanged)."""
    by_member = {m.fingerprint: inc for inc in incidents.values() for m in inc.members}
    out = []
    for s in states:
        inc = by_member.get(s.fingerprint)
        out.append(s if inc is None else replace(s, labels={**s.labels, **inc.labels()}))
    return out


def incident_link(dashboard_url: str | None, incident_id: str) -> str:
    return (dashboard_url or "").rstrip("/") + f"{INCIDENTS_PATH}?incident={incident_id}"


def group_labels(inc: Incident, dashboard_url: str | None, event: str) -> dict[str, str]:
    """What a notification of ``inc`` says about it (``event``: opened, re-attributed, grew, resolved or
    opened-resolved)."""
    return {
        **inc.labels(),
        "incident_event": event,
        "incident_summary": inc.summary,
        "incident_culprit": inc.culprit.text,
        "incident_jobs": ",".join(inc.jobs),
        "incident_users": ",".join(inc.users),
        "incident_action": inc.action,
        "incident_runbook": inc.runbook,
        "incident_severity": inc.severity,
        "incident_link": incident_link(dashboard_url, inc.id),
        "incident_began": format_timestamp(inc.started_at),
        "incident_fired": format_timestamp(inc.fired_at),
    }


def _event(inc: Incident) -> str | None:
    """Why ``inc`` is notified now, or None."""
    said = inc.notified
    if said is None:
        return "opened" if inc.is_open else "opened-resolved"  # it ended before it was told: told once, resolved
    if said.resolved:
        return None
    if not inc.is_open:
        return "resolved"
    if said.culprit != inc.culprit.key:
        return "re-attributed"
    if not set(inc.jobs) <= set(said.jobs) or not set(inc.gpus) <= set(said.gpus):
        return "grew"
    return None


def notify(
    grouper: Grouper,
    incidents: Mapping[str, Incident],
    states: Mapping[str, AlertState],
    now: float,
    dashboard_url: str | None = None,
) -> tuple[dict[str, Incident], list[Notification]]:
    """The incidents with what was notified recorded, and the round's incident notifications (no batch kept)."""
    out, notes, _ = notify_round(grouper, incidents, states, now, dashboard_url)
    return out, notes


def notify_round(
    grouper: Grouper,
    incidents: Mapping[str, Incident],
    states: Mapping[str, AlertState],
    now: float,
    dashboard_url: str | None = None,
    batch: GroupState | None = None,
) -> tuple[dict[str, Incident], list[Notification], GroupState | None]:
    """The incidents with what was notified recorded, the round's incident notifications and the message receivers'
    incident group (None when it has nothing to wait for)."""
    out = dict(incidents)
    due: list[tuple[Incident, str, list[AlertState], list[int]]] = []
    for inc in sorted(incidents.values(), key=lambda i: (i.fired_at, i.id)):
        event = _event(inc)
        if event is None:
            continue
        members = labelled((s for m in inc.members if (s := states.get(m.fingerprint)) is not None), incidents)
        heard = [s for s in members if s.muted != "silenced" and (s.state == FIRING or not inc.is_open)]
        routes = sorted(
            {i for s in heard for i in grouper.routes_for(s.labels) if grouper.routes[i].incidents},
        )
        if routes:
            due.append((inc, event, heard, routes))
    batch, flush = _tick(grouper.routes, batch, due, any(i.is_open for i in incidents.values()), now)
    single: list[Notification] = []
    bundles: dict[str, list[tuple[Incident, dict[str, str], list[AlertState]]]] = {}
    for inc, event, heard, routes in due:
        direct = [i for i in routes if not grouper.routes[i].batch]
        wait = min((grouper.routes[i].group_wait_s for i in direct), default=None)
        in_batch = flush and len(direct) < len(routes)
        if not in_batch and (wait is None or (event == "opened" and now - inc.fired_at < wait)):
            continue  # an action's incident is due at once; the others wait for the batch's next send
        if event == "resolved":
            routes = [i for i in routes if grouper.routes[i].send_resolved]
        labels = group_labels(inc, dashboard_url, event)
        alerts = sorted(heard, key=lambda s: (s.state != FIRING, s.fired_at or s.active_since, s.rule))
        direct_to = dict.fromkeys(grouper.routes[i].receiver for i in routes if not grouper.routes[i].batch)
        single.extend(_one(r, inc, labels, alerts, now) for r in direct_to)
        for r in dict.fromkeys(grouper.routes[i].receiver for i in routes if grouper.routes[i].batch):
            bundles.setdefault(r, []).append((inc, labels, alerts))
        out[inc.id] = replace(inc, notified=Notified(inc.culprit.key, inc.jobs, inc.gpus, not inc.is_open))
    return out, [*single, *(_bundle(r, items, now) for r, items in bundles.items())], batch


def _tick(
    routes: tuple[Route, ...],
    batch: GroupState | None,
    due: list[tuple[Incident, str, list[AlertState], list[int]]],
    any_open: bool,
    now: float,
) -> tuple[GroupState | None, bool]:
    """The message receivers' incident group after this round, and whether it sends now."""
    batched = [r for r in routes if r.batch]
    waiting = [(inc, event) for inc, event, _, at in due if any(routes[i].batch for i in at)]
    if not batched or (batch is None and not waiting):
        return None, False
    if batch is None:
        first = min(inc.fired_at if event == "opened" else now for inc, event in waiting)
        wait = min(r.group_wait_s for r in batched)
        batch = GroupState(BATCH_KEY, "", -1, {}, created_at=now, next_flush_at=first + wait)
    if now < batch.next_flush_at:
        return batch, False
    if not any_open:
        return None, True
    interval = min(r.group_interval_s for r in batched)
    last = now if waiting else batch.last_notified_at
    return replace(batch, next_flush_at=now + interval, last_notified_at=last), True


def _one(receiver: str, inc: Incident, labels: dict[str, str], alerts: list[AlertState], now: float) -> Notification:
    status = FIRING if inc.is_open else RESOLVED
    return Notification(receiver, f"incident:{inc.id}", labels, status, tuple(alerts), now)


def _bundle(receiver: str, items: list[tuple[Incident, dict[str, str], list[AlertState]]], now: float) -> Notification:
    """One receiver's message for the round: a single incident's shape when one is due, else all of them."""
    if len(items) == 1:
        return _one(receiver, *items[0], now)
    ids = ",".join(inc.id for inc, _, _ in items)
    status = FIRING if any(inc.is_open for inc, _, _ in items) else RESOLVED
    alerts = tuple(a for _, _, alerts in items for a in alerts)
    parts = tuple(labels for _, labels, _ in items)
    return Notification(receiver, f"incidents:{ids}", {"incidents": ids}, status, alerts, now, parts)


def withdrawn(
    grouper: Grouper, before: Iterable[AlertState], after: Iterable[AlertState], now: float
) -> list[Notification]:
    """Alertmanager's view of a re-attributed incident: a member alert whose incident labels changed this round (its
    culprit changed, or its incident merged into another) is a new alert there, so its old label set is sent once,
    resolved now (``endsAt`` now), with the new one, to the routes that took it (those without incidents), lest the
    old linger until its lease ends and the new wait for the next resend. ``before``: last round's alerts as sent
    (``labelled``); ``after``: this round's."""
    now_states = {s.fingerprint: s for s in after}
    out: list[Notification] = []
    for old in before:
        new = now_states.get(old.fingerprint)
        if old.state != FIRING or old.muted is not None or new is None or new.labels == old.labels:
            continue
        if "incident" not in old.labels:
            continue  # no incident label was sent: nothing of it lingers
        gone = replace(old, state=RESOLVED, resolved_at=now)
        told = (gone, new) if new.state == FIRING and new.muted is None else (gone,)
        for i in grouper.routes_for(old.labels):
            route = grouper.routes[i]
            if not route.incidents:
                key = f"withdrawn:{old.fingerprint}:{old.labels['incident']}@{now:.3f}"
                status = FIRING if len(told) > 1 else RESOLVED
                out.append(Notification(route.receiver, key, route.group_labels(old.labels), status, told, now))
    return out
