"""What an alert row opens: the alert's own description and evidence, and its rule's meaning and runbook.

The alert carries its description, ``cause``, ``stuck_ranks``, ``fabric`` and ``runbook`` annotations as the engine
wrote them; an episode read back from the history may carry fewer, so the rule's meaning and action come from the
catalogue's definition (``gpulens.alerts.catalogue``), the one place they are written. A user rule outside the
catalogue shows its own annotations only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from dash import html

from gpulens.alerts.catalogue import DEFINITIONS
from gpulens.alerts.state import AlertState
from gpulens.dashboard.timerange import minute_text

_MEANINGS: Final[Mapping[str, tuple[str, str]]] = {d.rule.name: (d.rule.meaning, d.rule.action) for d in DEFINITIONS}
# The annotations shown, in order, with their heading (the summary is the row's own text).
_EVIDENCE: Final = (("cause", "Cause"), ("stuck_ranks", "Stuck ranks"), ("fabric", "Fabric"))


def rule_text(rule: str) -> tuple[str, str]:
    """The rule's meaning and action from the catalogue, empty for a rule it does not hold."""
    return _MEANINGS.get(rule, ("", ""))


def when_text(alert: AlertState) -> str:
    """``began 00:40 UTC · fired 00:45 UTC``: when the fault began, and when the alert fired (or is pending)."""
    fired = f"fired {minute_text(alert.fired_at)}" if alert.fired_at is not None else "pending"
    return f"began {minute_text(alert.began)} · {fired}"


def alert_detail(alert: AlertState) -> html.Details:
    """The summary, opening onto the description, the evidence, the rule's meaning and its runbook."""
    meaning, action = rule_text(alert.rule)
    notes = alert.annotations
    body: list[html.Div] = []
    description = notes.get("description")
    if description:
        body.append(html.Div(description))
    for key, heading in _EVIDENCE:
        if notes.get(key):
            body.append(html.Div([html.Strong(f"{heading}: "), html.Span(notes[key], className="gl-pre")]))
    if meaning:
        body.append(html.Div([html.Strong("Means: "), meaning]))
    runbook = notes.get("runbook") or action
    if runbook:
        body.append(html.Div([html.Strong("Runbook: "), runbook], className="gl-runbook"))
    body.append(html.Div(when_text(alert), className="gl-hint"))
    return html.Details(
        [html.Summary(alert.summary or alert.rule), html.Div(body, className="gl-alert-body")], className="gl-alert"
    )
