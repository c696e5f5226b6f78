"""The incident layer, pure: alerts grouped by the causal table into incidents with a culprit, a blast radius and an
action; a cause arriving after its effect re-attributes the incident; one message per incident event."""

from __future__ import annotations

from dataclasses import replace

from gpulens.alerts.grouping import Grouper, Route
from gpulens.alerts.incidentnotify import labelled, notify
from gpulens.alerts.incidents import Incident, annotate, form
from gpulens.alerts.state import FIRING, RESOLVED, AlertState, fingerprint

T0 = 1_767_225_600.0
UUID = "GPU-aaaa"


def alert(
    rule: str, at: float, severity: str = "critical", notes: dict[str, str] | None = None, **labels: str
) -> AlertState:
    full = {"alertname": rule, "severity": severity, **labels}
    return AlertState(fingerprint(full), rule, full, dict(notes or {}), FIRING, at, fired_at=at, last_seen=at)


def states(*alerts: AlertState) -> dict[str, AlertState]:
    return {a.fingerprint: a for a in alerts}


GPU = {"node": "node-01", "gpu": "4", "uuid": UUID, "job_id": "llm", "user": "alice"}
STALL = alert(
    "CommunicationStall",
    T0,
    notes={"stuck_at": "12@node-01:4"},
    job_id="llm",
    user="alice",
    signature="rank_dead",
    nodes="node-00,node-01",
)
XID = alert("XidError", T0 + 10, xid="79", **GPU)
LOST = alert("GpuLost", T0 + 10, **GPU)


def test_a_gpu_off_the_bus_its_xid_and_its_dead_rank_are_one_incident_whose_culprit_is_the_gpu() -> None:
    now = states(STALL, XID, LOST)
    (incident,) = form({}, now, T0 + 10).values()
    c = incident.culprit
    assert (c.kind, c.node, c.gpu, c.uuid, c.job_id, c.rank) == ("gpu", "node-01", 4, UUID, None, None)
    assert incident.jobs == ("llm",)
    assert incident.users == ("alice",)
    assert incident.action == "reboot"
    assert incident.severity == "critical"
    assert {m.rule for m in incident.members if m.explained_by is None} == {"XidError", "GpuLost"}
    annotate(now, {incident.id: incident})
    assert now[STALL.fingerprint].annotations["incident"] == incident.id
    assert now[STALL.fingerprint].annotations["cause"].split(" ")[:2] in (
        ["GpuLost", "node-01"],
        ["XidError", "node-01"],
    )
    assert Incident.from_json(incident.to_json()) == incident  # what the store keeps reads back whole


def test_a_cause_after_its_effect_re_attributes_the_incident_and_messages_only_on_change() -> None:
    grouper = Grouper([Route("chat", group_wait_s=0.0, incidents=True)])
    events: list[tuple[str, str]] = []
    incidents: dict[str, Incident] = {}
    rounds = [
        (T0, states(STALL)),  # the stall alone: its dead rank is the culprit
        (T0 + 10, states(STALL, XID)),  # the XID of the rank's GPU a round later
        (T0 + 20, states(STALL, XID)),  # nothing new: no message
        (
            T0 + 30,
            states(
                replace(STALL, state=RESOLVED, resolved_at=T0 + 30), replace(XID, state=RESOLVED, resolved_at=T0 + 30)
            ),
        ),
    ]
    culprits = []
    for now, current in rounds:
        incidents = form(incidents, current, now)
        incidents, notes = notify(grouper, incidents, current, now)
        events += [(n.group_labels["incident"], n.group_labels["incident_event"]) for n in notes]
        culprits += [(i.id, i.culprit.kind, i.culprit.rank) for i in incidents.values()]
    (first_id, _, _) = culprits[0]
    assert culprits[:2] == [(first_id, "rank", 12), (first_id, "gpu", None)]  # the same id, never a second one
    assert events == [(first_id, "opened"), (first_id, "re-attributed"), (first_id, "resolved")]
    assert incidents[first_id].resolved_at == T0 + 30


def test_a_new_job_hurt_is_a_message_and_an_unexplained_alert_is_its_own_incident() -> None:
    grouper = Grouper([Route("chat", group_wait_s=0.0, incidents=True)])
    link = alert("IbLinkDown", T0, node="node-00", device="mlx5_1", port="1", job_id="a,b")
    stall_a = alert("CommunicationStall", T0, job_id="a", signature="spinning", nodes="node-00")
    stall_b = alert("CommunicationStall", T0 + 10, job_id="b", signature="spinning", nodes="node-00")
    hot = alert("GpuThermalThrottling", T0, "warning", node="node-03", gpu="1", uuid="GPU-hot")
    incidents, notes = notify(grouper, form({}, states(link, stall_a, hot), T0), states(link, stall_a, hot), T0)
    assert sorted(n.group_labels["culprit_kind"] for n in notes) == ["gpu", "port"]
    port = next(i for i in incidents.values() if i.culprit.kind == "port")
    assert port.jobs == ("a", "b")  # the link's own label names both jobs on its GPUs
    now = states(link, stall_a, stall_b, hot)
    incidents = form(incidents, now, T0 + 10)
    assert {m.rule for m in incidents[port.id].members} == {"IbLinkDown", "CommunicationStall"}
    assert len(incidents[port.id].members) == 3
    _, notes = notify(grouper, incidents, now, T0 + 10)
    assert notes == []  # the blast radius already named job b: no new message
    # Alertmanager's view: every member labelled with its incident and culprit
    view = {s.rule + s.labels.get("job_id", ""): s.labels for s in labelled(now.values(), incidents)}
    assert view["CommunicationStallb"]["incident"] == port.id
    assert view["CommunicationStallb"]["culprit_device"] == "mlx5_1"
    assert view["GpuThermalThrottling"]["culprit_uuid"] == "GPU-hot"


def test_a_route_that_does_not_take_incidents_keeps_its_grouping() -> None:
    grouper = Grouper([Route("am", group_by=("alertname",), group_wait_s=0.0)])
    now = states(STALL, XID, LOST)
    incidents = form({}, now, T0 + 10)
    _, notes = notify(grouper, incidents, now, T0 + 10)
    assert notes == []
    grouping = grouper.step({}, labelled(now.values(), incidents), T0 + 10)
    assert sorted(a.rule for n in grouping.notifications for a in n.alerts) == [
        "CommunicationStall",
        "GpuLost",
        "XidError",
    ]
