"""Alertmanager as a receiver, against the real ``prometheus-alertmanager`` (0.25): gpulens's alerts appear in its
API with their labels, annotations and dashboard links; its silences and inhibition apply; a resolved alert ends; an
HA pair gets every alert at both URLs; and an Alertmanager that is down costs no alert (the outbox keeps it)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from gpulens.alerts.config import build_notifiers, parse_alerting
from gpulens.alerts.engine import AlertEngine
from gpulens.alerts.notify.alertmanager import AlertmanagerNotifier, api_url, lease_s, postable_alerts
from gpulens.alerts.notify.delivery import Backoff, Delivery, InMemoryOutbox
from gpulens.alerts.service import AlertService
from gpulens.alerts.state import FIRING, RESOLVED, AlertState, StepResult, fingerprint
from gpulens.clock import SystemClock
from gpulens.config import ConfigError, format_timestamp
from gpulens.model import TargetHealth
from gpulens.storage import alertstore
from gpulens.storage.connect import open_database
from gpulens.storage.db import Database
from tests.alerts.amserver import Alertmanager
from tests.alerts.receivers import serve
from tests.alerts.support import T0, healthy_gpu, snapshot, uuid

DASHBOARD = "https://gpulens.example.org"


@pytest.fixture(scope="module")
def pair(alertmanager_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Alertmanager, ...]]:
    """Two Alertmanagers, as a Prometheus HA pair sends to them."""
    root = tmp_path_factory.mktemp("alertmanager")
    ams = tuple(Alertmanager(alertmanager_bin, root / name).start() for name in ("a", "b"))
    try:
        yield ams
    finally:
        for am in ams:
            am.stop()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Database]:
    db = open_database(f"sqlite:///{tmp_path / 'alerts.db'}")
    try:
        yield db
    finally:
        db.close()


def service(db: Database, pair: tuple[Alertmanager, ...]) -> AlertService:
    """GpuHotCritical (>= 85 °C) and GpuHotWarning (>= 70 °C), both firing at once, to the two Alertmanagers."""
    hot = {"field": "temperature_celsius", "op": ">=", "for": "0s"}
    config = parse_alerting(
        {
            "dashboard_url": DASHBOARD,
            "rules": [
                {"name": "GpuHotCritical", "threshold": 85, "severity": "critical", **hot},
                {"name": "GpuHotWarning", "threshold": 70, "severity": "warning", **hot},
            ],
            "receivers": [{"name": "am", "kind": "alertmanager", "url_env": ["AM_A", "AM_B"]}],
        }
    )
    environ = {"AM_A": pair[0].url, "AM_B": pair[1].url + "/"}
    return AlertService(db, config, environ=environ, backoff=Backoff(initial_s=5.0, jitter=0.0))


def process(svc: AlertService, now: float, temperatures: dict[str, float]) -> None:
    """One round at ``now``: GPU 0 of each node at its temperature."""
    snaps = [snapshot(node, [healthy_gpu(node, 0, temperature_celsius=t)]) for node, t in temperatures.items()]
    targets = [TargetHealth(n, f"http://{n}:9410", "gpulens", now, True, node=n) for n in temperatures]
    svc.process(now, snaps, targets)


def labelled(am: Alertmanager, alertname: str, node: str | None = None) -> dict[str, Any]:
    found = am.alert(alertname=alertname, **({"node": node} if node else {}))
    assert found is not None, f"{alertname} {node} not in {[a['labels'] for a in am.alerts()]}"
    return found


def test_alerts_appear_in_both_alertmanagers_with_labels_annotations_and_links(
    store: Database, pair: tuple[Alertmanager, ...]
) -> None:
    svc = service(store, pair)
    now = time.time()
    process(svc, now, {"n1-hot": 90.0, "n1-warm": 75.0})
    counts = svc.deliver(now)
    assert (counts.sent, counts.retried, counts.failed) == (6, 0, 0)  # 3 groups (by alertname) x 2 URLs
    for am in pair:
        critical = labelled(am, "GpuHotCritical", "n1-hot")
        incident = critical["labels"]["incident"]  # each member alert carries its incident and culprit
        assert incident.startswith("inc-")
        assert critical["labels"] == {
            "alertname": "GpuHotCritical",
            "severity": "critical",
            "node": "n1-hot",
            "gpu": "0",
            "uuid": uuid("n1-hot", 0),
            "incident": incident,
            "culprit_kind": "gpu",
            "culprit_node": "n1-hot",
            "culprit_gpu": "0",
            "culprit_uuid": uuid("n1-hot", 0),
        }
        assert critical["generatorURL"] == f"{DASHBOARD}/gpus/{uuid('n1-hot', 0)}"
        assert critical["annotations"]["summary"]
        assert critical["annotations"]["dashboard"] == critical["generatorURL"]
        assert critical["status"]["state"] == "active"
        ends = time.mktime(time.strptime(critical["endsAt"][:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
        assert ends > now + 200  # 4 x max(1m resend, 10 s rounds) ahead: Alertmanager ends it if gpulens stops
        # Alertmanager's inhibition: the critical alert of node n1-hot mutes that node's warning, not n1-warm's.
        inhibited = labelled(am, "GpuHotWarning", "n1-hot")
        assert inhibited["status"]["state"] == "suppressed"
        assert inhibited["status"]["inhibitedBy"] == [critical["fingerprint"]]
        assert labelled(am, "GpuHotWarning", "n1-warm")["status"]["state"] == "active"
        watchdog = labelled(am, "Watchdog")
        assert watchdog["labels"] == {"alertname": "Watchdog", "severity": "none"}
        assert watchdog["generatorURL"] == DASHBOARD  # no page of its own: the dashboard


def test_a_silence_of_alertmanager_applies_and_a_resolved_alert_ends(
    store: Database, pair: tuple[Alertmanager, ...]
) -> None:
    am = pair[0]
    svc = service(store, pair)
    start = time.time() - 20  # the rounds happened: the resolution lies in the past when it arrives
    process(svc, start, {"n2-a": 75.0, "n2-b": 75.0})
    svc.deliver(start)
    silence = am.silence({"alertname": "GpuHotWarning", "node": "n2-a"})
    silenced = labelled(am, "GpuHotWarning", "n2-a")
    assert silenced["status"] == {"state": "suppressed", "silencedBy": [silence], "inhibitedBy": []}
    assert labelled(am, "GpuHotWarning", "n2-b")["status"]["state"] == "active"

    process(svc, start + 10, {"n2-a": 75.0, "n2-b": 40.0})  # n2-b cools down: its alert resolves
    counts = svc.deliver(start + 10)
    assert counts.sent == 2  # the alertname's group, to each URL: n2-a still firing, n2-b resolved
    for each in pair:
        assert each.alert(alertname="GpuHotWarning", node="n2-b") is None  # resolved: gone from the active alerts
        assert each.alert(alertname="GpuHotWarning", node="n2-a") is not None


def test_an_alertmanager_that_is_down_costs_no_alert(store: Database, pair: tuple[Alertmanager, ...]) -> None:
    down, up = pair
    svc = service(store, pair)
    down.stop()
    try:
        now = time.time()
        process(svc, now, {"n3": 90.0})
        counts = svc.deliver(now)
        # 3 groups (GpuHotCritical, GpuHotWarning, Watchdog) to each URL: the first one to the stopped
        # Alertmanager fails, its two others wait for the next pass; the running one gets all three at once.
        assert (counts.sent, counts.retried, counts.deferred) == (3, 1, 2)
        assert up.alert(alertname="GpuHotCritical", node="n3") is not None
        pending = alertstore.outbox_items(store, status="pending")
        assert sorted((item.receiver, item.attempts) for item in pending) == [("am#1", 0), ("am#1", 0), ("am#1", 1)]
        assert "cannot connect" in str([item.last_error for item in pending])
    finally:
        down.start()  # the same port again: an Alertmanager back from a restart, its alerts lost
    assert down.alert(alertname="GpuHotCritical", node="n3") is None
    counts = svc.deliver(time.time() + 60)  # past the retry's backoff
    assert (counts.sent, counts.retried) == (3, 0)
    critical = labelled(down, "GpuHotCritical", "n3")
    assert critical["generatorURL"] == f"{DASHBOARD}/gpus/{uuid('n3', 0)}"
    assert alertstore.outbox_items(store, status="pending") == []
    # Delivered notifications leave the outbox an hour later (one per group and URL each minute would pile up).
    assert len(alertstore.outbox_items(store, status="sent")) == 6
    process(svc, now + 3700, {"n3": 90.0})  # the resends of the hour's end: pending, the sent ones pruned
    assert {item.status for item in alertstore.outbox_items(store)} == {"pending"}


def test_test_notify_reaches_each_alertmanager_of_the_receiver(pair: tuple[Alertmanager, ...], tmp_path: Path) -> None:
    config = tmp_path / "gpulens.toml"
    config.write_text('[[alerts.receivers]]\nname = "am"\nkind = "alertmanager"\nurl_env = ["AM_A", "AM_B"]\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")}
    result = subprocess.run(
        [sys.executable, "-m", "gpulens.cli", "alerts", "test-notify", "am", "--config", str(config)],
        env={**env, "AM_A": pair[0].url, "AM_B": pair[1].url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "test notification delivered to am (2 URLs)"
    for am in pair:
        assert labelled(am, "GpulensTestNotification")["labels"]["severity"] == "info"


def test_a_re_attributed_incident_leaves_only_its_new_label_set_active(pair: tuple[Alertmanager, ...]) -> None:
    """A dead rank's stall, then the XID of the rank's GPU: the incident's culprit changes from the rank to the GPU,
    so the stall's ``culprit_*`` labels change and Alertmanager sees a new alert; the old label set is withdrawn
    (sent once, ending now) instead of lingering until its lease ends."""
    am = pair[0]
    config = parse_alerting({"receivers": [{"name": "am", "kind": "alertmanager", "url_env": "AM"}]})
    outbox = InMemoryOutbox()
    engine = AlertEngine([], routes=config.routes, outbox=outbox)
    delivery = Delivery(outbox, build_notifiers(config.receivers, environ={"AM": am.url}), clock=SystemClock())
    now = time.time()
    gpu = {"node": "n-moved", "gpu": "4", "uuid": uuid("n-moved", 4), "job_id": "moved"}

    def fired(rule: str, at: float, notes: dict[str, str] | None = None, **labels: str) -> AlertState:
        full = {"alertname": rule, "severity": "critical", **labels}
        return AlertState(fingerprint(full), rule, full, notes or {}, FIRING, at, fired_at=at, last_seen=at)

    stall = fired("CommunicationStall", now - 20, {"stuck_at": "12@n-moved:4"}, job_id="moved", signature="rank_dead")
    xid = fired("XidError", now - 10, xid="79", **gpu)
    engine.settle(now - 10, StepResult({stall.fingerprint: stall}, [], []))
    delivery.run_due(now - 10)
    before = labelled(am, "CommunicationStall", None)
    assert before["labels"]["culprit_kind"] == "rank"
    engine.settle(now, StepResult({stall.fingerprint: stall, xid.fingerprint: xid}, [], []))
    counts = delivery.run_due(now)
    assert counts.failed == 0
    stalls = [a for a in am.alerts() if a["labels"].get("job_id") == "moved" and "xid" not in a["labels"]]
    assert [a["labels"]["culprit_kind"] for a in stalls] == ["gpu"]  # only the new label set is active
    assert stalls[0]["labels"]["culprit_uuid"] == gpu["uuid"]
    assert stalls[0]["labels"]["incident"] == before["labels"]["incident"]  # the same incident, re-attributed
    assert labelled(am, "XidError", "n-moved")["labels"]["incident"] == before["labels"]["incident"]


# --- without a server: the resend schedule, the rendering and the config ------------------------------------------


def am_config(**receiver: Any) -> Any:
    hot = {"name": "GpuHot", "field": "temperature_celsius", "threshold": 85, "for": "0s"}
    return parse_alerting(
        {
            "rules": [hot],
            "receivers": [
                {"name": "am", "kind": "alertmanager", "url_env": "AM", **receiver},
                {"name": "chat", "kind": "slack", "url_env": "SLACK"},
            ],
        }
    )


def test_a_firing_alert_is_sent_at_once_and_again_every_resend_interval() -> None:
    config = am_config(resend_interval="1m")
    outbox = InMemoryOutbox()
    rules = [r for r in config.rules if r.name in ("GpuHot", "Watchdog")]
    engine = AlertEngine(rules, routes=config.routes, outbox=outbox, destinations=config.destinations())
    sent: dict[str, list[float]] = {}
    told: list[int] = []
    for k in range(14):  # rounds every 10 s for 130 s; a second GPU gets hot in the round at 30 s
        now = T0 + 10 * k
        hot = {"n1": 90.0, "n2": 90.0 if k >= 3 else 40.0}
        snaps = [snapshot(n, [healthy_gpu(n, 0, temperature_celsius=t)]) for n, t in hot.items()]
        for note in engine.process(now, snaps, []).notifications:
            sent.setdefault(f"{note.receiver}:{note.alerts[0].rule}", []).append(now - T0)
            if note.receiver == "chat":
                told.append(len(note.incidents))
    # Alertmanager: at once, then every minute; a new alert of the group goes at once (with the group's others).
    assert sent["am:GpuHot"] == [0, 30, 90]
    assert sent["am:Watchdog"] == [0, 60, 120]
    # Slack is told of both incidents (one per hot GPU) in one message, after the first one's 30 s wait (the second
    # fired in that round), and never of the Watchdog.
    assert sent["chat:GpuHot"] == [30]
    assert told == [2]
    assert "chat:Watchdog" not in sent


def test_postable_alerts_end_ahead_while_firing_and_at_the_resolution_once_resolved() -> None:
    labels = {"alertname": "GpuHot", "severity": "warning", "node": "n1"}
    firing = AlertState(fingerprint(labels), "GpuHot", labels, {"dashboard": "/gpus/U"}, FIRING, T0, fired_at=T0)
    resolved = replace(firing, state=RESOLVED, resolved_at=T0 + 50)
    docs = postable_alerts([firing, resolved], now=T0 + 60, lease_s=lease_s(60, 10), external_url="https://d")
    assert docs[0] == {
        "labels": labels,
        "annotations": {"dashboard": "/gpus/U"},
        "startsAt": format_timestamp(T0),
        "endsAt": format_timestamp(T0 + 60 + 240),
        "generatorURL": "/gpus/U",
    }
    assert docs[1]["endsAt"] == format_timestamp(T0 + 50)
    assert lease_s(60, 120) == 480  # 4 x the rules' interval when it is the longer
    assert api_url("https://am.example/prefix/") == "https://am.example/prefix/api/v2/alerts"


def test_each_url_is_a_destination_with_its_own_notifier() -> None:
    config = am_config(url_env=["A", "B"])
    assert config.destinations() == {"am": ("am#1", "am#2"), "chat": ("chat",)}
    notifiers = build_notifiers(config.receivers, environ={"A": "http://a", "B": "http://b", "SLACK": "x"})
    assert set(notifiers) == {"am#1", "am#2", "chat"}
    assert isinstance(notifiers["am#2"], AlertmanagerNotifier)


class _Capture(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        self.server.state.append((self.path, self.headers.get("Authorization"), body))  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


def test_many_alerts_go_in_batches_of_256_with_the_receivers_credentials() -> None:
    posts: list[tuple[str, str | None, list[dict[str, Any]]]] = []
    alerts = [
        AlertState(fingerprint({"n": str(i)}), "GpuHot", {"alertname": "GpuHot", "n": str(i)}, {}, FIRING, T0)
        for i in range(300)
    ]
    with serve(_Capture, posts) as url:
        base = url.removesuffix("/hook") + "/prefix/"
        notifier = AlertmanagerNotifier(base, name="am", username="gpulens", password_source=lambda: "secret")
        notifier.send(alerts, group_labels={}, status=FIRING)
    assert [(path, len(body)) for path, _, body in posts] == [
        ("/prefix/api/v2/alerts", 256),
        ("/prefix/api/v2/alerts", 44),
    ]
    assert {auth for _, auth, _ in posts} == {"Basic " + base64.b64encode(b"gpulens:secret").decode()}
    assert [a["labels"]["n"] for _, _, body in posts for a in body] == [str(i) for i in range(300)]


@pytest.mark.parametrize(
    ("receiver", "route", "key", "message"),
    [
        ({}, {"group_wait": "30s"}, "alerts.routes[0].group_wait", "take no timing"),
        ({}, {"repeat_interval": "4h"}, "alerts.routes[0].repeat_interval", "resend_interval"),
        ({"kind": "webhook", "url_env": ["A", "B"]}, {}, "alerts.receivers[0].url_env", "several URLs"),
        ({"kind": "webhook", "resend_interval": "1m"}, {}, "alerts.receivers[0].resend_interval", "alertmanager"),
        ({"url_file": ["a", ""], "url_env": None}, {}, "alerts.receivers[0].url_file", "one per URL"),
    ],
)
def test_bad_alertmanager_config_names_the_key(
    receiver: dict[str, Any], route: dict[str, Any], key: str, message: str
) -> None:
    table = {k: v for k, v in {"name": "am", "kind": "alertmanager", "url_env": "AM", **receiver}.items() if v}
    with pytest.raises(ConfigError) as err:
        parse_alerting({"receivers": [table], "routes": [{"receiver": "am", **route}]})
    assert err.value.key == key
    assert message in err.value.message
