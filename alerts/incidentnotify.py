"""One notification per incident (pure): what the engine sends to Slack, webhook and log receivers.

Routes whose receiver takes incidents (``Route.incidents``: Slack, webhook and log receivers) get no member alert
on its own: an incident goes to the routes that any of its (unsilenced) members matches, once when it opens (after
the route's ``group_wait``, so a cause a round behind its effect is in the first message), and again only when its
culprit changes, its blast radius (jobs or GPUs) grows, or it resolves. Each message is a ``Notification`` whose
``group_key`` is ``incident:<id>`` and whose group labels carry the verdict (``incident``, ``culprit_*`` and
``incident_*``: summary, jobs, users, action, runbook, link), with the member alerts as its alerts.

Routes to Alertmanager receivers keep the grouper (``alerts.grouping``): every member alert goes with the
``incident`` and ``culprit_*`` labels (``labelled``), so that Alertmanager's ``group_by: [incident]`` groups alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from gpulens.alerts.grouping import Grouper, Notification
from gpulens.alerts.incidents import Incident, Notified
from gpulens.alerts.state import FIRING, RESOLVED, AlertState

INCIDENTS_PATH = "/incidents"


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
    """What a notification of ``inc`` says about it (``event``: opened, re-attributed, grew, resolved)."""
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
    }


def _event(inc: Incident) -> str | None:
    """Why ``inc`` is notified now, or None."""
    said = inc.notified
    if said is None:
        return "opened" if inc.is_open else None
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
    """The incidents with what was notified recorded, and the round's incident notifications."""
    out = dict(incidents)
    notes: list[Notification] = []
    for inc in sorted(incidents.values(), key=lambda i: (i.fired_at, i.id)):
        event = _event(inc)
        if event is None:
            continue
        members = labelled((s for m in inc.members if (s := states.get(m.fingerprint)) is not None), incidents)
        heard = [s for s in members if s.muted != "silenced" and (s.state == FIRING or not inc.is_open)]
        routes = sorted(
            {i for s in heard for i in grouper.routes_for(s.labels) if grouper.routes[i].incidents},
        )
        if not routes:
            continue
        if event == "opened" and now - inc.fired_at < min(grouper.routes[i].group_wait_s for i in routes):
            continue
        if event == "resolved":
            routes = [i for i in routes if grouper.routes[i].send_resolved]
        labels = group_labels(inc, dashboard_url, event)
        alerts = tuple(sorted(heard, key=lambda s: (s.state != FIRING, s.fired_at or s.active_since, s.rule)))
        status = FIRING if inc.is_open else RESOLVED
        receivers = dict.fromkeys(grouper.routes[i].receiver for i in routes)
        notes.extend(Notification(r, f"incident:{inc.id}", labels, status, alerts, now) for r in receivers)
        out[inc.id] = replace(inc, notified=Notified(inc.culprit.key, inc.jobs, inc.gpus, not inc.is_open))
    return out, notes
