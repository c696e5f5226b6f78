"""What a remediation action acts on: one ``RemediationCase`` (a verdict on one culprit of one node), and its audit.

An action never reads an alert or an incident directly; it takes a case, built by an adapter:

- ``case_from_alert``: today's input, an alert of a listed rule (``Rule`` or ``Rule:xid``). The case id is the
  alert's fingerprint, the culprit its GPU, the action the XID catalogue's (``xidcatalogue.xid_action``) or the
  rule's (``RULE_ACTIONS``).
- an incident (``alerts.incidents``) maps field for field: ``RemediationCase(incident.id, incident.culprit.kind,
  incident.culprit.node, incident.action, tuple(incident.jobs), ...)``; the seam is ``case_from_incident``'s
  signature, which takes the fields rather than the class so that this module does not depend on it.

``DRAIN_VERDICTS`` are the catalogue's actions that take a node out of service; ``check-application`` and ``none``
never drain (an application's own fault leaves the node healthy).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from gpulens.alerts.names import ECC_UNCORRECTABLE, GPU_LOST
from gpulens.alerts.state import FIRING, RESOLVED, AlertState
from gpulens.xidcatalogue import ACTIONS, HARDWARE_INSPECTION, NONE, REBOOT, RESET_GPU, xid_action

DRAIN_VERDICTS: Final = frozenset({RESET_GPU, REBOOT, HARDWARE_INSPECTION})
CULPRIT_KINDS: Final = ("gpu", "port", "rank", "node", "job")
# The verdict of a listed rule without an XID: a lost GPU needs a reboot, an uncorrectable ECC error a reset.
RULE_ACTIONS: Final = {GPU_LOST: REBOOT, ECC_UNCORRECTABLE: RESET_GPU}

# Outcomes of a decision (the audit's ``outcome``).
DRAINED: Final = "drained"
DRY_RUN: Final = "dry-run"
RESUMED: Final = "resumed"
REQUEUED: Final = "requeued"
RAN: Final = "ran"
KEPT: Final = "kept"  # resolved, but other causes still hold the node (or resume_on_resolve is off)
JOINED: Final = "joined"  # already drained by gpulens: one more cause holds it
LEFT_ALONE: Final = "left-alone"
REFUSED_COOLDOWN: Final = "refused-cooldown"
REFUSED_FRACTION: Final = "refused-max-fraction"
REFUSED_NO_NODE: Final = "refused-no-node"
REFUSED_NODE_NAME: Final = "refused-node-name"
REFUSED_OPTED_OUT: Final = "refused-opted-out"
REFUSED_APPLICATION: Final = "refused-application"
REFUSED_HALTED: Final = "refused-halted"
HALTED: Final = "halted"
FAILED: Final = "failed"
REFUSALS: Final = (
    REFUSED_COOLDOWN,
    REFUSED_FRACTION,
    REFUSED_NO_NODE,
    REFUSED_NODE_NAME,
    REFUSED_OPTED_OUT,
    REFUSED_APPLICATION,
    REFUSED_HALTED,
)

# Steps (the audit's ``step``).
DRAIN: Final = "drain"
RESUME: Final = "resume"
REQUEUE: Final = "requeue"
COMMAND: Final = "command"


@dataclass(frozen=True)
class RemediationCase:
    """One verdict: ``case_id`` (an incident id, or an alert's fingerprint), what is at fault (``culprit_kind`` and
    ``culprit``, a short text such as ``gpu 3 (GPU-…) XidError 79``), the node as the input named it (checked
    against Slurm before use), the catalogue's ``action``, the jobs in its blast radius, the alert rules behind it,
    the GPU, and whether it is open (``firing``) or resolved."""

    case_id: str
    culprit_kind: str
    node: str
    action: str
    jobs: tuple[str, ...] = ()
    alerts: tuple[str, ...] = ()
    culprit: str = ""
    gpu: str = ""
    firing: bool = True

    @property
    def drains(self) -> bool:
        return self.action in DRAIN_VERDICTS

    @property
    def rule(self) -> str:
        return ",".join(self.alerts)


@dataclass(frozen=True)
class DrainRecord:
    """One decision of an action: what it did (or would do, or refused) to which node, why, and for which cases."""

    time: float
    action: str  # the [[alerts.actions]] entry's name
    node: str
    gpu: str
    rule: str
    outcome: str  # DRAINED, DRY_RUN, RESUMED, REFUSED_*, FAILED, ...
    reason: str  # the drain reason given to Slurm, or why it was refused or failed
    step: str = DRAIN
    causes: str = ""  # the case ids behind it, space-separated


def listed(alert: AlertState, rules: Sequence[str]) -> bool:
    """Whether the alert is of a listed rule (``Rule`` or ``Rule:xid``)."""
    xid = alert.labels.get("xid")
    return alert.rule in rules or (xid is not None and f"{alert.rule}:{xid}" in rules)


def case_from_alert(alert: AlertState) -> RemediationCase:
    """The case of one alert: its fingerprint, its GPU as the culprit, the catalogue's action for its XID (or the
    rule's), the job in its labels."""
    labels = alert.labels
    xid = labels.get("xid", "")
    rule = alert.rule + (f":{xid}" if xid else "")
    if labels.get("action") in ACTIONS:
        action = labels["action"]
    elif xid.isdigit():
        action = xid_action(int(xid))
    else:
        action = RULE_ACTIONS.get(alert.rule, RESET_GPU)
    gpu = labels.get("gpu", "")
    uuid = labels.get("uuid", "")
    culprit = f"gpu {gpu or '?'}" + (f" ({uuid})" if uuid else "") + f" {alert.rule}" + (f" {xid}" if xid else "")
    job = labels.get("job_id", "")
    return RemediationCase(
        case_id=alert.fingerprint,
        culprit_kind="gpu" if gpu or uuid else "node",
        node=labels.get("node", ""),
        action=action,
        jobs=(job,) if job else (),
        alerts=(rule,),
        culprit=culprit,
        gpu=gpu,
        firing=alert.state == "firing",
    )


def case_from_incident(
    incident_id: str,
    *,
    culprit_kind: str,
    node: str,
    action: str,
    jobs: Sequence[str],
    alerts: Sequence[str],
    gpu: str = "",
    culprit: str = "",
    open_: bool = True,
) -> RemediationCase:
    """The case of one incident (``alerts.incidents``), its fields passed one by one: the seam where incidents feed
    the actions in place of alerts."""
    return RemediationCase(
        case_id=incident_id,
        culprit_kind=culprit_kind,
        node=node,
        action=action,
        jobs=tuple(jobs),
        alerts=tuple(alerts),
        culprit=culprit or f"{culprit_kind} {gpu}".strip(),
        gpu=gpu,
        firing=open_,
    )


INCIDENT_GROUP: Final = "incident:"
NONE_ACTION: Final = "none"  # the group key of an incident's notification (``alerts.incidentnotify``)


def cases_from_notification(
    alerts: Sequence[AlertState], group_labels: Mapping[str, str], status: str, group_key: str, rules: Sequence[str]
) -> list[RemediationCase]:
    """What an action receives, as cases. An incident's notification (its verdict in ``group_labels``) is one case,
    the incident's culprit and action, when any of its members is of a listed rule; alerts on their own (a route
    without incidents) are one case each."""
    if not group_key.startswith(INCIDENT_GROUP):
        return [case_from_alert(a) for a in alerts if a.state in (FIRING, RESOLVED) and listed(a, rules)]
    members = [a for a in alerts if listed(a, rules)]
    if not members or "incident" not in group_labels:
        return []
    gpu = group_labels.get("culprit_gpu", "")
    jobs = [j for j in group_labels.get("incident_jobs", "").split(",") if j]
    action = group_labels.get("incident_action", "")
    if action in ("", NONE):  # the catalogue has no word on it: a rule the operator listed speaks, as alone
        action = case_from_alert(members[0]).action
    rule_names = sorted({a.rule + (f":{a.labels['xid']}" if a.labels.get("xid") else "") for a in members})
    return [
        case_from_incident(
            group_labels["incident"],
            culprit_kind=group_labels.get("culprit_kind", ""),
            node=group_labels.get("culprit_node", ""),
            action=action,
            jobs=jobs,
            alerts=rule_names,
            gpu=gpu,
            culprit=group_labels.get("incident_culprit", ""),
            open_=status == FIRING,
        )
    ]
