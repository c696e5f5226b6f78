"""One message a round for the incidents due, not one per incident: Slack, webhook and log receivers get the
incidents that open, change or resolve together as one message (a single incident keeps its own message's shape),
and every incident is in some message when it opens and when it resolves. When a fault began travels with each
alert to webhooks and Slack, and survives a restart (the history rebuilt from the stored events)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from gpulens.alerts.config import parse_alerting
from gpulens.alerts.grouping import Grouper, Route
from gpulens.alerts.incidentnotify import BATCH_KEY, notify_round
from gpulens.alerts.incidents import Incident, form
from gpulens.alerts.notify.slack import SlackNotifier
from gpulens.alerts.service import SqlAlertReader
from gpulens.alerts.state import FIRING, RESOLVED, AlertState, fingerprint
from gpulens.cli.simulation import SimulateReport, simulate
from gpulens.config import format_timestamp
from gpulens.storage.connect import open_database

from .receivers import recording_receiver

T0 = 1_767_225_600.0
HANGS = Path(__file__).resolve().parents[2] / "examples" / "scenarios" / "hangs.toml"
CHAT = Route("chat", group_wait_s=30.0, group_interval_s=300.0, incidents=True, batch=True)


def stall(job: str, at: float) -> AlertState:
    labels = {"alertname": "CommunicationStall", "severity": "critical", "job_id": job, "signature": "spinning"}
    return AlertState(fingerprint(labels), "CommunicationStall", labels, {}, FIRING, at, fired_at=at, last_seen=at)


def test_four_hangs_are_three_messages_and_each_incident_is_in_one_when_it_opens_and_when_it_resolves() -> None:
    """The hangs scenario's timing: one job hangs, two more 11 minutes later, a fourth 5 minutes after them; all end
    together. Grouped by alertname that was 3 messages; one per incident, 8."""
    grouper = Grouper([CHAT])
    alerts = {"a": stall("a", T0), "b": stall("b", T0 + 660), "c": stall("c", T0 + 660), "d": stall("d", T0 + 960)}
    end = T0 + 1200
    incidents: dict[str, Incident] = {}
    batch = None
    messages: list[tuple[float, list[tuple[str, str]], Any]] = []
    for k in range(0, 160):
        now = T0 + 10 * k
        current = {
            s.fingerprint: (s if now < end else replace(s, state=RESOLVED, resolved_at=end))
            for s in alerts.values()
            if s.active_since <= now
        }
        incidents = form(incidents, current, now)
        incidents, notes, batch = notify_round(grouper, incidents, current, now, "https://gpulens.example", batch)
        for n in notes:
            parts = list(n.incidents) or [n.group_labels]
            messages.append((now, sorted((p["incident"], p["incident_event"]) for p in parts), n))
    assert batch is None  # nothing open and nothing to say: the group is gone (not stored)
    by_job = {inc.jobs[0]: inc.id for inc in incidents.values()}
    assert [(at - T0, said) for at, said, _ in messages] == [
        (30.0, [(by_job["a"], "opened")]),  # the first waits group_wait
        (930.0, sorted([(by_job["b"], "opened"), (by_job["c"], "opened")])),  # the next look, group_interval on
        (
            1230.0,
            sorted(
                [
                    (by_job["a"], "resolved"),
                    (by_job["b"], "resolved"),
                    (by_job["c"], "resolved"),
                    (by_job["d"], "opened-resolved"),  # it ended before the next look: told, never lost
                ]
            ),
        ),
    ]
    single, pair, last = (n for _, _, n in messages)
    # one incident: the single-incident message as before; several: one message carrying each verdict
    assert single.group_key == f"incident:{by_job['a']}"
    assert single.incidents == ()
    assert single.group_labels["incident"] == by_job["a"]
    ids = ",".join(v["incident"] for v in pair.incidents)
    assert sorted(ids.split(",")) == sorted([by_job["b"], by_job["c"]])
    assert pair.group_key == f"incidents:{ids}"
    assert pair.group_labels == {"incidents": ids}
    assert {a.labels["incident"] for a in pair.alerts} == {by_job["b"], by_job["c"]}
    assert last.status == RESOLVED
    assert type(pair).from_payload(pair.payload()) == pair  # what the outbox keeps reads back whole


def test_a_message_about_several_incidents_has_a_section_each_and_says_when_each_fault_began() -> None:
    grouper = Grouper([replace(CHAT, group_wait_s=0.0)])
    current = {s.fingerprint: s for s in (stall(f"job{i}", T0 - 60) for i in range(12))}
    incidents, notes, _ = notify_round(grouper, form({}, current, T0), current, T0, "https://gpulens.example")
    (note,) = notes
    assert len(note.incidents) == 12
    body = SlackNotifier("http://127.0.0.1:9/unused").render(
        note.alerts, group_labels=note.group_labels, status=note.status, incidents=note.incidents
    )
    blocks = body["attachments"][0]["blocks"]
    assert blocks[0]["text"]["text"].startswith("[FIRING] 12 incidents: ")
    sections = [b for b in blocks if b["type"] == "section"]
    assert len(sections) == 10  # at most 10 incidents shown, then "and N more"
    assert blocks[-1]["elements"][0]["text"] == "and 2 more"
    for section, verdict in zip(sections, note.incidents, strict=False):
        text = section["text"]["text"]
        assert verdict["incident"] in text
        assert f"*Fault began:* {format_timestamp(T0 - 60)}" in text
        assert f"https://gpulens.example/incidents?incident={verdict['incident']}" in text
    assert set(incidents) == {v["incident"] for v in note.incidents}


@dataclass
class HangsRun:
    report: SimulateReport
    slack: list[Any]
    hooks: list[dict[str, Any]]
    db_url: str


@pytest.fixture(scope="module")
def hangs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HangsRun]:
    """The hangs example through the production path, Slack and a webhook receiving over HTTP on 127.0.0.1."""
    url = f"sqlite:///{tmp_path_factory.mktemp('hangs') / 'sim.db'}"
    receivers = {
        "receivers": [
            {"name": "chat", "kind": "slack", "url_env": "SLACK_URL"},
            {"name": "hook", "kind": "webhook", "url_env": "HOOK_URL"},
        ]
    }
    with recording_receiver() as (slack_url, slack), recording_receiver() as (hook_url, hook):
        report = simulate(
            HANGS,
            db_url=url,
            alerting=parse_alerting(receivers),
            environ={"SLACK_URL": slack_url, "HOOK_URL": hook_url},
        )
        yield HangsRun(report, slack.all(), [h for h in hook.all() if h["groupKey"].startswith("incident")], url)


def test_the_hangs_example_is_three_slack_messages_and_no_incident_goes_untold(hangs: HangsRun) -> None:
    assert len(hangs.report.incidents) == 4  # four jobs hang: four incidents
    assert len(hangs.slack) == 3  # as many as grouping by alertname sent (8 with one message per incident)
    assert len(hangs.hooks) == 3
    told: dict[str, set[str]] = {}
    for payload in hangs.hooks:
        for verdict in payload.get("incidents") or [payload["groupLabels"]]:
            told.setdefault(verdict["incident"], set()).add(verdict["incident_event"])
    for incident in hangs.report.incidents:
        events = told[str(incident["id"])]
        assert events & {"opened", "opened-resolved"}, incident["id"]
        assert events & {"resolved", "opened-resolved"}, incident["id"]
    slack_text = str(hangs.slack)
    for incident in hangs.report.incidents:
        assert str(incident["id"]) in slack_text


def _began(payloads: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """The stalls' (beganAt, startsAt) by job, as the webhook received them."""
    return {
        a["labels"]["job_id"]: (a["beganAt"], a["startsAt"])
        for p in payloads
        for a in p["alerts"]
        if a["labels"]["alertname"] == "CommunicationStall"
    }


def test_the_webhook_says_when_each_hang_began_and_a_restart_keeps_it(hangs: HangsRun) -> None:
    began = _began(hangs.hooks)
    assert set(began) == {"spin", "blocked", "mixed", "pcie-blocked"}
    for job, (began_at, starts_at) in began.items():
        assert began_at < starts_at, job  # the hang began before its stall alert fired
    assert began["spin"][0] < "2026-01-01T00:16:00Z"  # the hang began at 15 minutes in
    # a restarted process rebuilds the alert history from the stored events: when each fault began is kept
    db = open_database(hangs.db_url)
    try:
        start = 1_767_225_600.0
        episodes = SqlAlertReader(db).history(start, start + 3600)
        rebuilt = {e.labels["job_id"]: format_timestamp(e.began) for e in episodes if e.rule == "CommunicationStall"}
        assert rebuilt == {job: b for job, (b, _) in began.items()}
        assert all(not k.startswith("__") for e in episodes for k in e.labels)  # the stored began is no label
    finally:
        db.close()


def test_the_batch_is_kept_with_the_notification_groups() -> None:
    """The message receivers' incident group is stored beside the alert groups, so a restart keeps its clock."""
    grouper = Grouper([CHAT])
    current = {s.fingerprint: s for s in (stall("x", T0),)}
    _, notes, batch = notify_round(grouper, form({}, current, T0), current, T0)
    assert notes == []  # waits group_wait
    assert batch is not None
    assert batch.key == BATCH_KEY
    assert batch.next_flush_at == T0 + 30
    assert type(batch).from_json(batch.to_json()) == batch
