"""Alertmanager as a receiver, against the real ``prometheus-alertmanager`` (0.25): gpulens's alerts appear in its
API with their labels, annotations and dashboard links; its silences and inhibition apply; a resolved alert ends; an
HA pair gets every alert at both URLs; and an Alertmanager that is down costs no alert (the outbox keeps it)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulens.alerts.config import parse_alerting
from gpulens.alerts.notify.delivery import Backoff
from gpulens.alerts.service import AlertService
from gpulens.model import TargetHealth
from gpulens.storage import alertstore
from gpulens.storage.connect import open_database
from gpulens.storage.db import Database
from tests.alerts.amserver import Alertmanager
from tests.alerts.support import healthy_gpu, snapshot, uuid

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
        assert critical["labels"] == {
            "alertname": "GpuHotCritical",
            "severity": "critical",
            "node": "n1-hot",
            "gpu": "0",
            "uuid": uuid("n1-hot", 0),
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
