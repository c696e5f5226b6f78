"""``Watchdog``: the alert that always fires, a dead-man's switch for the alerting pipeline (as kube-prometheus has).

It holds in every round the engine evaluates, labelled only ``alertname`` and ``severity`` (``none``), so it fires at
once and never resolves while gpulens evaluates rules. Whatever watches it (Alertmanager routing it to a heartbeat
service, a webhook's tool) pages when it stops arriving. Only webhook and alertmanager receivers get it
(``alerts.config``): a person need not read it.
"""

from __future__ import annotations

from gpulens.alerts.base import AlertRule, Candidate, rule_labels
from gpulens.alerts.history import History

SUMMARY = "An alert that always fires while gpulens evaluates its rules: its alerting pipeline works."
DESCRIPTION = (
    "gpulens's dead-man's switch. It fires in every evaluation round, so it should always be firing in Alertmanager "
    "and always reach its receiver; a heartbeat check (a dead-man's-switch service) pages when it stops."
)


def watchdog(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    """One candidate, every round."""
    return [Candidate(rule.name, rule_labels(rule, {}), 1.0, SUMMARY, DESCRIPTION)]
