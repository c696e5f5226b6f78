"""Routing and Alertmanager-like grouping: group_wait, group_interval, repeat_interval, resolved, muted, continue."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gpulens.alerts.grouping import Grouper, GroupState, Notification, Route
from gpulens.alerts.matchers import parse_matcher
from gpulens.alerts.state import FIRING, RESOLVED, AlertState, fingerprint


def alert(name: str = "GpuLost", state: str = FIRING, muted: str | None = None, **labels: str) -> AlertState:
    full = {"alertname": name, "severity": "critical", **labels}
    return AlertState(
        fingerprint=fingerprint(full),
        rule=name,
        labels=full,
        annotations={"summary": f"{name} {labels}"},
        state=state,
        active_since=0.0,
        fired_at=0.0,
        resolved_at=None if state == FIRING else 1.0,
        muted=muted,
    )


class Clock:
    """Runs the grouper round after round, keeping its group states the way storage would."""

    def __init__(self, routes: Sequence[Route]) -> None:
        self.grouper = Grouper(routes)
        self.groups: dict[str, GroupState] = {}
        self.now = 0.0

    def at(self, now: float, alerts: Sequence[AlertState]) -> list[Notification]:
        self.now = now
        result = self.grouper.step(self.groups, alerts, now)
        self.groups = result.groups
        return result.notifications


ROUTE = Route("ops", group_by=("alertname",), group_wait_s=30.0, group_interval_s=300.0, repeat_interval_s=3600.0)


def fps(note: Notification) -> list[str]:
    return [a.labels.get("gpu", "") for a in note.alerts]


def test_first_notification_waits_for_group_wait_and_gathers_the_group() -> None:
    c = Clock([ROUTE])
    a0, a1 = alert(node="n", gpu="0"), alert(node="n", gpu="1")
    assert c.at(0.0, [a0]) == []
    assert c.at(10.0, [a0, a1]) == []
    [note] = c.at(30.0, [a0, a1])
    assert note.receiver == "ops"
    assert note.status == FIRING
    assert note.group_labels == {"alertname": "GpuLost"}
    assert fps(note) == ["0", "1"]


def test_new_alerts_wait_for_group_interval_and_repeat_after_repeat_interval() -> None:
    c = Clock([ROUTE])
    a0, a1 = alert(node="n", gpu="0"), alert(node="n", gpu="1")
    c.at(0.0, [a0])
    assert len(c.at(30.0, [a0])) == 1
    assert c.at(100.0, [a0, a1]) == []  # next flush at 330
    [note] = c.at(330.0, [a0, a1])
    assert fps(note) == ["0", "1"]
    assert c.at(630.0, [a0, a1]) == []  # nothing new
    # rounds every 10 s: flushes at 930, 1230, ...; the first one at least repeat_interval after 330 re-notifies
    repeats = [t for t in range(640, 4500, 10) if c.at(float(t), [a0, a1])]
    assert repeats == [3930]


def test_resolution_is_notified_once_then_the_group_ends() -> None:
    c = Clock([ROUTE])
    a0 = alert(node="n", gpu="0")
    c.at(0.0, [a0])
    c.at(30.0, [a0])
    gone = replace(a0, state=RESOLVED, resolved_at=40.0)
    [note] = c.at(330.0, [gone])
    assert note.status == RESOLVED
    assert [a.state for a in note.alerts] == [RESOLVED]
    assert c.groups == {}
    assert c.at(630.0, [gone]) == []


def test_partial_resolution_reports_firing_with_the_resolved_alert() -> None:
    c = Clock([ROUTE])
    a0, a1 = alert(node="n", gpu="0"), alert(node="n", gpu="1")
    c.at(0.0, [a0, a1])
    c.at(30.0, [a0, a1])
    [note] = c.at(330.0, [a0, replace(a1, state=RESOLVED)])
    assert note.status == FIRING
    assert [(a.labels["gpu"], a.state) for a in note.alerts] == [("0", FIRING), ("1", RESOLVED)]


def test_alert_resolved_before_it_was_notified_is_not_notified() -> None:
    c = Clock([ROUTE])
    a0 = alert(node="n", gpu="0")
    c.at(0.0, [a0])
    assert c.at(30.0, [replace(a0, state=RESOLVED)]) == []
    assert c.groups == {}


def test_muted_alerts_are_left_out() -> None:
    c = Clock([ROUTE])
    silenced = alert(node="n", gpu="0", muted="silenced")
    assert c.at(0.0, [silenced]) == []
    assert c.at(60.0, [silenced]) == []
    unmuted = replace(silenced, muted=None)  # the silence expired while it still fires
    c.at(120.0, [unmuted])
    [note] = c.at(150.0, [unmuted])
    assert fps(note) == ["0"]


def test_groups_split_by_group_by_labels() -> None:
    route = replace(ROUTE, group_by=("alertname", "job_id"))
    c = Clock([route])
    alerts = [alert(job_id="a", gpu="0"), alert(job_id="b", gpu="1"), alert(job_id="a", gpu="2")]
    c.at(0.0, alerts)
    notes = c.at(30.0, alerts)
    assert sorted((n.group_labels["job_id"], len(n.alerts)) for n in notes) == [("a", 2), ("b", 1)]


def test_group_by_everything() -> None:
    c = Clock([replace(ROUTE, group_by=("...",))])
    alerts = [alert(gpu="0"), alert(gpu="1")]
    c.at(0.0, alerts)
    assert len(c.at(30.0, alerts)) == 2


def test_routes_first_match_wins_unless_continue() -> None:
    critical = Route("pager", matchers=(parse_matcher("severity=critical"),), group_wait_s=0.0)
    everything = Route("slack", group_wait_s=0.0)
    c = Clock([critical, everything])
    notes = c.at(0.0, [alert(gpu="0"), alert("GpuPowerCapped", gpu="1", severity="info")])
    assert sorted(n.receiver for n in notes) == ["pager", "slack"]
    assert {n.receiver: n.alerts[0].rule for n in notes} == {"pager": "GpuLost", "slack": "GpuPowerCapped"}

    both = Clock([replace(critical, continue_=True), everything])
    assert sorted(n.receiver for n in both.at(0.0, [alert(gpu="0")])) == ["pager", "slack"]

    none = Clock([critical])
    assert none.at(0.0, [alert("Info", severity="info")]) == []


def test_send_resolved_false_drops_resolutions() -> None:
    c = Clock([replace(ROUTE, send_resolved=False)])
    a0 = alert(gpu="0")
    c.at(0.0, [a0])
    c.at(30.0, [a0])
    assert c.at(330.0, [replace(a0, state=RESOLVED)]) == []
    assert c.groups == {}


def test_group_states_survive_a_restart_through_json() -> None:
    c = Clock([ROUTE])
    a0 = alert(gpu="0")
    c.at(0.0, [a0])
    c.at(30.0, [a0])
    restored = {k: GroupState.from_json(g.to_json()) for k, g in c.groups.items()}
    assert restored == c.groups
    fresh = Clock([ROUTE])
    fresh.groups = restored
    assert fresh.at(330.0, [a0]) == []  # already notified before the restart


def test_notification_payload_round_trip() -> None:
    c = Clock([replace(ROUTE, group_wait_s=0.0)])
    [note] = c.at(5.0, [alert(gpu="0")])
    assert Notification.from_payload(note.payload()) == note
