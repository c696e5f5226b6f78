"""The engine end to end: replay output, grouping into the outbox, silences, and a restart that keeps its states."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpulens.alerts.config import load_rules_file
from gpulens.alerts.engine import AlertEngine
from gpulens.alerts.grouping import Notification, Route
from gpulens.alerts.matchers import parse_matcher
from gpulens.alerts.notify.delivery import InMemoryOutbox
from gpulens.alerts.replay import AlertTimeline, read_round, replay, rounds, table
from gpulens.alerts.rules import builtin_rules
from gpulens.alerts.state import FIRING, RESOLVED, Silence, Transition
from gpulens.config import parse_timestamp
from gpulens.exporter.sim import SimCluster, load_scenario

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "scenarios"
MINUTE = 60.0


def test_replay_json_is_what_simulate_prints() -> None:
    scenario = load_scenario(EXAMPLES / "stall.toml")
    report = replay(
        SimCluster(scenario), start=scenario.start, end=scenario.end, step_s=scenario.step_s, rules=builtin_rules()
    )
    assert report.rounds == 270
    [doc] = json.loads(json.dumps(report.to_json()))
    assert set(doc) == {"alertname", "severity", "labels", "startsAt", "endsAt", "summary"}
    assert (doc["alertname"], doc["severity"]) == ("CommunicationStall", "critical")
    assert doc["labels"] == {
        "alertname": "CommunicationStall",
        "severity": "critical",
        "job_id": "llm-pretrain",
        "user": "alice",
        "signature": "spinning",
        "nodes": "node-00,node-01",
    }
    assert parse_timestamp(doc["startsAt"]) == scenario.start + 25 * MINUTE
    assert parse_timestamp(doc["endsAt"]) == scenario.start + 30 * MINUTE


def test_still_firing_at_the_end_has_no_end() -> None:
    scenario = load_scenario(EXAMPLES / "faults.toml")
    cluster = SimCluster(scenario)
    report = replay(cluster, start=scenario.start, end=scenario.end, step_s=scenario.step_s, rules=builtin_rules())
    lost = next(a for a in report.to_json() if a["alertname"] == "GpuLost")
    assert lost["endsAt"] is None


def test_a_node_that_cannot_be_read_is_a_failed_scrape() -> None:
    scenario = load_scenario(EXAMPLES / "faults.toml")
    snapshots, targets = read_round(SimCluster(scenario), scenario.start + 22 * MINUTE)
    assert "node-04" not in {s.node for s in snapshots}
    down = next(t for t in targets if t.node == "node-04")
    assert not down.up
    assert "exporter is down" in str(down.last_error)
    assert all(t.up for t in targets if t.node != "node-04")


def test_rounds_cover_start_to_end() -> None:
    scenario = load_scenario(EXAMPLES / "stall.toml")
    times = [t for t, _, _ in rounds(SimCluster(scenario), scenario.start, scenario.start + 60.0, 10.0)]
    assert times == [scenario.start + 10.0 * k for k in range(6)]
    with pytest.raises(ValueError, match="step_s"):
        list(rounds(SimCluster(scenario), 0.0, 1.0, 0.0))


def run_engine(
    engine: AlertEngine, scenario, start: float, end: float, timeline: AlertTimeline | None = None
) -> list[Transition]:
    """Drive the engine over [start, end); the transitions it made."""
    transitions = []
    for t, snapshots, targets in rounds(SimCluster(scenario), start, end, scenario.step_s):
        result = engine.process(t, snapshots, targets)
        transitions += result.result.transitions
        if timeline is not None:
            timeline.observe(result.result)
    return transitions


def notifications(outbox: InMemoryOutbox) -> list[Notification]:
    return [Notification.from_payload(item.payload) for item in outbox.items.values()]


ROUTES = [Route("ops", group_by=("alertname", "job_id"), group_wait_s=30.0, group_interval_s=300.0)]


def test_engine_groups_the_faults_into_the_outbox() -> None:
    scenario = load_scenario(EXAMPLES / "faults.toml")
    outbox = InMemoryOutbox()
    engine = AlertEngine(builtin_rules(), routes=ROUTES, outbox=outbox, dashboard_url="https://gpulens.example")
    run_engine(engine, scenario, scenario.start, scenario.end)
    notes = notifications(outbox)
    saturation = [n for n in notes if n.group_labels.get("alertname") == "NvlinkBandwidthSaturated"]
    assert [(n.status, len(n.alerts)) for n in saturation] == [(FIRING, 8), (RESOLVED, 8)]  # one group, 8 GPUs
    stall = [n for n in notes if n.group_labels.get("alertname") == "CommunicationStall"]
    by_job: dict[str, list[str]] = {}
    for n in stall:
        by_job.setdefault(n.group_labels["job_id"], []).append(n.status)
    assert by_job == {job: [FIRING, RESOLVED] for job in ("pretrain", "hang-spin", "hang-blocked", "hang-mixed")}
    stall = [n for n in stall if n.group_labels["job_id"] == "pretrain"]
    assert stall[0].alerts[0].annotations["dashboard"] == "https://gpulens.example/jobs/pretrain"
    # ExporterDown's node was quiet while it was down; nothing on node-04 was notified then
    down = (scenario.start + 20 * MINUTE, scenario.start + 25 * MINUTE)
    during = [n for n in notes if down[0] < n.created_at < down[1]]
    assert all(a.labels.get("node") != "node-04" or a.rule == "ExporterDown" for n in during for a in n.alerts)


def test_a_silenced_node_is_not_notified() -> None:
    scenario = load_scenario(EXAMPLES / "faults.toml")
    silence = Silence("1", (parse_matcher("node=node-03"),), scenario.start, scenario.end, "maintenance", "ops")
    outbox = InMemoryOutbox()
    engine = AlertEngine(builtin_rules(), routes=ROUTES, outbox=outbox, silences=lambda: [silence])
    timeline = AlertTimeline()
    run_engine(engine, scenario, scenario.start, scenario.end, timeline)
    assert any(a.labels.get("node") == "node-03" for a in timeline.alerts)  # they still fire...
    notified = {a.labels.get("node") for n in notifications(outbox) for a in n.alerts}
    assert "node-03" not in notified  # ...but nobody is told
    assert "node-05" in notified


def test_restart_keeps_firing_alerts_and_does_not_notify_them_again() -> None:
    """A collector restart: states and groups come back from storage, the history starts empty."""
    scenario = load_scenario(EXAMPLES / "faults.toml")
    whole_box = InMemoryOutbox()
    whole = AlertEngine(builtin_rules(), routes=ROUTES, outbox=whole_box)
    run_engine(whole, scenario, scenario.start, scenario.end)

    box = InMemoryOutbox()
    first = AlertEngine(builtin_rules(), routes=ROUTES, outbox=box)
    restart_at = scenario.start + 37 * MINUTE  # the stall and the NVLink errors fire, the saturation is pending
    run_engine(first, scenario, scenario.start, restart_at)
    firing = {fp for fp, s in first.states.items() if s.state == FIRING}
    second = AlertEngine(builtin_rules(), routes=ROUTES, outbox=box, states=first.states, groups=first.groups)
    timeline = AlertTimeline()
    after = run_engine(second, scenario, restart_at, scenario.end, timeline)

    refired = [a for a in timeline.alerts if a.fingerprint in firing]
    assert refired == []
    firing_sent: dict[str, int] = {}
    for note in notifications(box):
        for a in note.alerts:
            if a.state == FIRING and note.status == FIRING:
                firing_sent[a.fingerprint] = firing_sent.get(a.fingerprint, 0) + 1
    whole_sent = {a.fingerprint for n in notifications(whole_box) for a in n.alerts if a.state == FIRING}
    assert set(firing_sent) == whole_sent
    stall = next(fp for fp, s in first.states.items() if s.rule == "CommunicationStall")
    [resolved] = [t for t in after if t.fingerprint == stall]
    assert resolved.state == RESOLVED
    assert resolved.at >= scenario.start + 40 * MINUTE  # when the stall ended, not at the restart


def test_user_rules_from_a_rules_file_replay_like_promtool(tmp_path: Path) -> None:
    """`gpulens simulate --rules FILE`: the user's own rule, alone, over a scenario."""
    path = tmp_path / "rules.toml"
    path.write_text(
        '[[rules]]\nname = "GpuHot"\nfield = "temperature_celsius"\nop = ">="\nthreshold = 91\nfor = "1m"\n'
        'summary = "GPU {node}:{gpu} at {value:.0f} C"\n'
    )
    scenario = load_scenario(EXAMPLES / "faults.toml")
    report = replay(
        SimCluster(scenario),
        start=scenario.start,
        end=scenario.end,
        step_s=scenario.step_s,
        rules=load_rules_file(path),
    )
    [hot] = report.to_json()
    assert (hot["alertname"], hot["labels"]["node"], hot["labels"]["gpu"]) == ("GpuHot", "node-03", "1")
    assert parse_timestamp(hot["startsAt"]) == scenario.start + 16 * MINUTE  # thermal_throttle at 15m, for 1m
    assert hot["summary"].startswith("GPU node-03:1 at 9")


def test_readable_table() -> None:
    scenario = load_scenario(EXAMPLES / "demo.toml")
    report = replay(
        SimCluster(scenario), start=scenario.start, end=scenario.end, step_s=scenario.step_s, rules=builtin_rules()
    )
    lines = table(report.alerts, scenario.start).splitlines()
    assert lines[0].split()[:5] == ["FIRED", "ENDED", "ALERT", "SEVERITY", "SUBJECT"]
    rows = [line.split()[:5] for line in lines[1:]]
    assert ["+9m", "+14m", "CommunicationStall", "critical", "job"] in rows
    assert ["+30m", "firing", "GpuIdleAllocated", "info", "node-03:4"] in rows
    assert len(rows) == len(report.alerts)
