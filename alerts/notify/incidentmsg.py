"""An incident as a Slack message (``alerts.incidentnotify`` sends one per incident event): the verdict first
(culprit, jobs and users, action and runbook, why it is sent now), then each member alert's summary, then the link
to the dashboard's Incidents page. Within Slack's limits as ``notify.slack`` keeps them (its ``fit``, which
escapes): at most 10 members of at most about 420 characters each fill one section under Slack's 3,000."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from gpulens.alerts.state import FIRING, RESOLVED, AlertState

EVENTS: Final = {
    "opened": "opened",
    "re-attributed": "re-attributed: the culprit changed",
    "grew": "grew: more jobs or GPUs hurt",
    "resolved": "resolved: every member alert has",
}


def is_incident(group_labels: Mapping[str, str]) -> bool:
    return bool(group_labels.get("incident_summary"))


def incident_message(
    alerts: Sequence[AlertState],
    group_labels: Mapping[str, str],
    status: str,
    *,
    fit: Callable[[str, int], str],
    max_alerts: int,
) -> tuple[str, list[dict[str, Any]]]:
    """The title and the Block Kit blocks of an incident's message."""
    g = group_labels
    mark = "FIRING" if status == FIRING else "RESOLVED"
    title = f"[{mark}] incident {g.get('incident_culprit', '')}: {g.get('incident_summary', '')}"
    jobs = g.get("incident_jobs") or "none known"
    users = g.get("incident_users")
    lines = [
        f"*Culprit:* {fit(g.get('incident_culprit', ''), 200)}",
        f"*Jobs hurt:* {fit(jobs, 600)}" + (f" (users {fit(users, 300)})" if users else ""),
        f"*Action:* {fit(g.get('incident_action', 'none'), 40)}",
    ]
    if g.get("incident_runbook"):
        lines.append(f"*Do:* {fit(g['incident_runbook'], 900)}")
    lines.append(f"*Incident {fit(g.get('incident', ''), 40)}* {EVENTS.get(g.get('incident_event', ''), '')}")
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": title[:149]}},
        {"type": "section", "text": _mrkdwn("\n".join(lines))},
    ]
    firing = [a for a in alerts if a.state == FIRING]
    resolved = [a for a in alerts if a.state == RESOLVED]
    shown = (firing + resolved)[:max_alerts]
    members = [
        f"{'Resolved' if a.state == RESOLVED else a.severity.capitalize() or 'Firing'}: "
        + fit(a.summary or a.rule, 280)
        + (f" _(caused by {fit(a.annotations['cause'].split(':')[0], 120)})_" if a.annotations.get("cause") else "")
        for a in shown
    ]
    if len(firing) + len(resolved) > len(shown):
        members.append(f"and {len(firing) + len(resolved) - len(shown)} more")
    if members:
        blocks.append({"type": "section", "text": _mrkdwn(fit("\n".join(members), 3000))})
    link = g.get("incident_link", "")
    if link.startswith(("http://", "https://")) and not any(c in link for c in "<>|\n"):
        blocks.append(
            {"type": "context", "elements": [_mrkdwn(f"<{link}|Open the incident in the gpulens dashboard>")]}
        )
    return title, blocks


def _mrkdwn(text: str) -> dict[str, Any]:
    return {"type": "mrkdwn", "text": text, "verbatim": True}
