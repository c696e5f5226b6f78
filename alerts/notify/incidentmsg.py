"""An incident as a Slack message (``alerts.incidentnotify``): the verdict first (culprit, jobs and users, action
and runbook, when the fault began, why it is sent now), then each member alert's summary, then the link to the
dashboard's Incidents page; a message about several incidents has a section of each. Within Slack's limits as
``notify.slack`` keeps them (its ``fit``, which escapes): at most 10 members of at most about 420 characters each
fill one section under Slack's 3,000."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from gpulens.alerts.state import FIRING, RESOLVED, AlertState

EVENTS: Final = {
    "opened": "opened",
    "re-attributed": "re-attributed: the culprit changed",
    "grew": "grew: more jobs or GPUs hurt",
    "resolved": "resolved: every member alert has",
    "opened-resolved": "opened and resolved: it ended before its first message",
}
# The incidents a message about several shows, a section each (Slack allows 50 blocks).
MAX_INCIDENTS: Final = 10


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
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": title[:149]}},
        {"type": "section", "text": _mrkdwn("\n".join(_verdict(g, fit)))},
    ]
    members = _members(alerts, fit, max_alerts)
    if members:
        blocks.append({"type": "section", "text": _mrkdwn(fit("\n".join(members), 3000))})
    link = g.get("incident_link", "")
    if _linkable(link):
        blocks.append(
            {"type": "context", "elements": [_mrkdwn(f"<{link}|Open the incident in the gpulens dashboard>")]}
        )
    return title, blocks


def incidents_message(
    alerts: Sequence[AlertState],
    incidents: Sequence[Mapping[str, str]],
    status: str,
    *,
    fit: Callable[[str, int], str],
    max_alerts: int,
) -> tuple[str, list[dict[str, Any]]]:
    """The title and the blocks of a message about several incidents: a section each (its verdict, its first
    members, its link), at most ``MAX_INCIDENTS``, then "and N more"."""
    mark = "FIRING" if status == FIRING else "RESOLVED"
    title = f"[{mark}] {len(incidents)} incidents: " + "; ".join(g.get("incident_culprit", "") for g in incidents)
    blocks: list[dict[str, Any]] = [{"type": "header", "text": {"type": "plain_text", "text": title[:149]}}]
    for g in incidents[:MAX_INCIDENTS]:
        lines = [f"*{fit(g.get('incident_summary', ''), 400)}*", *_verdict(g, fit)]
        own = [a for a in alerts if a.labels.get("incident") == g.get("incident")]
        lines += _members(own, fit, max(1, max_alerts // 3))
        link = g.get("incident_link", "")
        if _linkable(link):
            lines.append(f"<{link}|Open the incident in the gpulens dashboard>")
        blocks.append({"type": "section", "text": _mrkdwn(fit("\n".join(lines), 3000))})
    if len(incidents) > MAX_INCIDENTS:
        blocks.append({"type": "context", "elements": [_mrkdwn(f"and {len(incidents) - MAX_INCIDENTS} more")]})
    return title, blocks


def _verdict(g: Mapping[str, str], fit: Callable[[str, int], str]) -> list[str]:
    """An incident's verdict, a line each: culprit, jobs and users, action, runbook, and why it is sent now."""
    jobs = g.get("incident_jobs") or "none known"
    users = g.get("incident_users")
    lines = [
        f"*Culprit:* {fit(g.get('incident_culprit', ''), 200)}",
        f"*Jobs hurt:* {fit(jobs, 600)}" + (f" (users {fit(users, 300)})" if users else ""),
        f"*Action:* {fit(g.get('incident_action', 'none'), 40)}",
    ]
    if g.get("incident_runbook"):
        lines.append(f"*Do:* {fit(g['incident_runbook'], 900)}")
    if g.get("incident_began"):
        lines.append(f"*Fault began:* {fit(g['incident_began'], 40)}")
    lines.append(f"*Incident {fit(g.get('incident', ''), 40)}* {EVENTS.get(g.get('incident_event', ''), '')}")
    return lines


def _members(alerts: Sequence[AlertState], fit: Callable[[str, int], str], max_alerts: int) -> list[str]:
    """The member alerts' summaries, the firing first, at most ``max_alerts``, then "and N more"."""
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
    return members


def _linkable(link: str) -> bool:
    return link.startswith(("http://", "https://")) and not any(c in link for c in "<>|\n")


def _mrkdwn(text: str) -> dict[str, Any]:
    return {"type": "mrkdwn", "text": text, "verbatim": True}
