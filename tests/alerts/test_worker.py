"""The notification worker over a real outbox (SQLite and PostgreSQL) and real receivers on 127.0.0.1: delivery in
order per (group, receiver) through failures and Retry-After, supersession in the SQL outbox, and a worker that
stops within 5 s while a receiver hangs or drips its answer."""

from __future__ import annotations

import dataclasses
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from gpulens.alerts.config import AlertingConfig, parse_alerting
from gpulens.alerts.notify.delivery import PENDING, SENT, SUPERSEDED, Backoff, Delivery
from gpulens.alerts.notify.webhook import WebhookNotifier
from gpulens.alerts.notify.worker import NotificationWorker
from gpulens.alerts.service import AlertService, SqlOutbox
from gpulens.clock import SystemClock
from gpulens.model import NodeSnapshot, TargetHealth
from gpulens.rounds import RoundResult
from gpulens.storage import alertstore
from gpulens.storage.db import Database
from tests.alerts.receivers import drip_receiver, flaky_receiver, hanging_receiver
from tests.fakes.static_source import node_snapshot
from tests.storage.conftest import PgServer, _pg_root, clock, db, db_url, pg_server, private_pg_server

__all__ = ["_pg_root", "clock", "db", "db_url", "pg_server", "private_pg_server"]  # the storage tests' fixtures


@pytest.fixture
def refused() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/hook"


HOT = 95.0
COOL = 50.0


def alerting(receiver_env: str = "HOOK_URL", timeout: str = "10s") -> AlertingConfig:
    """GpuHot on each GPU (for 0), one group per alert, no waiting: every change is a notification (no Watchdog)."""
    return parse_alerting(
        {
            "builtin": {"Watchdog": {"enabled": False}},
            "rules": [
                {
                    "name": "GpuHot",
                    "field": "temperature_celsius",
                    "op": ">=",
                    "threshold": 80,
                    "scope": "gpu",
                    "for": "0s",
                    "severity": "warning",
                }
            ],
            "receivers": [{"name": "hook", "kind": "webhook", "url_env": receiver_env, "timeout": timeout}],
            "routes": [
                {
                    "receiver": "hook",
                    "group_by": ["..."],
                    "group_wait": "0s",
                    "group_interval": "0s",
                    "repeat_interval": "1h",
                }
            ],
        }
    )


def snapshot(now: float, temperatures: list[float]) -> NodeSnapshot:
    base = node_snapshot("node-00", gpus=len(temperatures), t=now)
    gpus = tuple(dataclasses.replace(g, temperature_celsius=t) for g, t in zip(base.gpus, temperatures, strict=True))
    return base.replace(gpus=gpus)


def round_at(now: float, temperatures: list[float]) -> RoundResult:
    target = TargetHealth("node-00", "http://node-00", "gpulens", now, True, node="node-00")
    return RoundResult(time=now, snapshots=[snapshot(now, temperatures)], targets=[target], written=True)


def wait_until(condition: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_a_flaky_receiver_ends_with_each_groups_true_last_state(db: Database) -> None:
    """500, 500, 500, 429 Retry-After 2, 200: the stale FIRING must not arrive after the RESOLVED."""
    script = [(500, {}), (500, {}), (500, {}), (429, {"Retry-After": "2"})]
    with flaky_receiver(script) as (url, receiver):
        service = AlertService(
            db,
            alerting(),
            clock=SystemClock(),
            environ={"HOOK_URL": url},
            backoff=Backoff(initial_s=0.2, factor=1.0, jitter=0.0),
            poll_s=0.1,
        ).start()
        try:
            service.hook(round_at(time.time(), [HOT, HOT]))  # both GPUs fire: two groups
            wait_until(lambda: len(receiver.received) >= 1)  # the first attempt failed: FIRING is being retried
            time.sleep(0.2)
            service.hook(round_at(time.time(), [COOL, HOT]))  # GPU 0 resolves while its FIRING is undelivered
            wait_until(lambda: not alertstore.outbox_items(db, status=PENDING))
        finally:
            service.close()
        gpu0 = node_snapshot("node-00", gpus=2).gpus[0].uuid
        # a webhook is told of incidents (each GPU's own), those due at once in one message (incidents:<id>,<id>)
        told: dict[str, list[str]] = {}
        for r in receiver.accepted():
            for incident in r.group_key.split(":", 1)[1].split(","):
                told.setdefault(incident, []).append(r.status)
        culprits = {i.id: i.culprit.uuid for i in service.engine.incidents.values()}
        assert len(told) == 2
        for incident, statuses in told.items():  # nothing stale after the last state, no FIRING after a RESOLVED
            assert statuses[-1] == ("resolved" if culprits[incident] == gpu0 else "firing")
            if "resolved" in statuses:
                assert "firing" not in statuses[statuses.index("resolved") :]
        # the two GPUs' FIRING was one message; GPU 0's RESOLVED, about one of them, waited for it
        assert [r.group_key.startswith("incidents:") for r in receiver.accepted()] == [True, False]
        assert [r.answered for r in receiver.received[:4]] == [500, 500, 500, 429]
        items = alertstore.outbox_items(db)
        assert {i.status for i in items} <= {SENT, SUPERSEDED}


def test_a_newer_state_supersedes_the_undelivered_one_in_the_sql_outbox(db: Database) -> None:
    outbox = SqlOutbox(db)
    payload = {"receiver": "hook", "group_key": "g1", "group_labels": {}, "status": "firing", "alerts": []}
    first = outbox.enqueue("hook", payload, 100.0)
    other = outbox.enqueue("hook", {**payload, "group_key": "g2"}, 100.0)
    outbox.mark_retry(first, 160.0, "HTTP 500")
    second = outbox.enqueue("hook", {**payload, "status": "resolved"}, 110.0)
    items = {i.id: i for i in alertstore.outbox_items(db)}
    assert items[first].status == SUPERSEDED
    assert items[other].status == PENDING  # another group is untouched
    # the newer state takes the older one's place in the retry schedule: it cannot overtake it
    assert (items[second].next_attempt_at, items[second].attempts) == (160.0, 1)
    assert [i.id for i in outbox.due(200.0, 10)] == [other, second]
    outbox.mark_sent(first, 120.0)  # a send of the superseded item that was in flight ends: it stays superseded
    assert {i.id: i.status for i in alertstore.outbox_items(db)}[first] == SUPERSEDED
    assert outbox.next_attempt_at() == 100.0


@pytest.mark.parametrize("receiver", ["hanging", "drip"])
def test_the_worker_stops_within_5s_while_a_receiver_hangs_or_drips(db: Database, receiver: str) -> None:
    serve = hanging_receiver if receiver == "hanging" else drip_receiver
    with serve() as url:
        outbox = SqlOutbox(db)
        delivery = Delivery(outbox, {"hook": WebhookNotifier(url, name="hook", timeout_s=30.0)}, clock=SystemClock())
        worker = NotificationWorker(delivery, poll_s=0.1)
        payload = {
            "receiver": "hook",
            "group_key": "g",
            "group_labels": {},
            "status": "firing",
            "alerts": [],
            "created_at": 0,
        }
        item = outbox.enqueue("hook", payload, time.time())
        worker.start()
        worker.wake()
        time.sleep(1.5)  # the send is in flight, 28 s from its own timeout
        started = time.monotonic()
        assert worker.stop(timeout_s=5.0)
        assert time.monotonic() - started < 5.0
        [stored] = [i for i in alertstore.outbox_items(db) if i.id == item]
        assert stored.status == PENDING  # cut short: still owed, at least once


def test_a_dripping_receiver_times_out_as_a_whole_request() -> None:
    """A socket timeout bounds each read; the notifier's timeout bounds the whole request."""
    with drip_receiver() as url:
        notifier = WebhookNotifier(url, name="drip", timeout_s=1.0)
        started = time.monotonic()
        with pytest.raises(Exception, match="timed out after 1 s") as caught:
            notifier.send((), group_labels={}, status="firing", group_key="g")
        assert getattr(caught.value, "retryable", False)
        assert time.monotonic() - started < 5.0


def test_a_receiver_that_is_down_is_not_stormed(db: Database, refused: str) -> None:
    """Items deferred after a failure wait for the next poll: one attempt per pass, not a tight loop."""
    outbox = SqlOutbox(db)
    delivery = Delivery(
        outbox,
        {"down": WebhookNotifier(refused, name="down", timeout_s=1.0)},
        clock=SystemClock(),
        backoff=Backoff(initial_s=60.0, jitter=0.0),
    )
    passes: list[Any] = []
    worker = NotificationWorker(delivery, poll_s=0.5, on_pass=passes.append)
    base = {"receiver": "down", "group_labels": {}, "status": "firing", "alerts": [], "created_at": 0}
    for i in range(20):
        outbox.enqueue("down", {**base, "group_key": f"g{i}"}, time.time())
    worker.start()
    try:
        time.sleep(1.2)
    finally:
        worker.stop()
    attempted = [i for i in alertstore.outbox_items(db) if i.attempts > 0]
    assert 1 <= len(passes) <= 4  # woken at start, then once per 0.5 s poll
    assert len(attempted) == len(passes)  # one attempt per pass: the rest deferred


def test_the_alert_service_starts_while_the_database_is_down(private_pg_server: PgServer) -> None:
    """Built while PostgreSQL is down, it loads the stored states at the first round that reaches the database."""
    url = private_pg_server.url(private_pg_server.create_database())
    first_db = Database(url)
    first_db.upgrade()
    first = AlertService(first_db, alerting(), notifiers={})
    t0 = time.time()
    first.hook(round_at(t0, [HOT, COOL]))
    [fired] = [s for s in first.engine.states.values() if s.state == "firing"]
    first_db.close()
    private_pg_server.stop()
    db = Database(url)
    try:
        service = AlertService(db, alerting(), notifiers={})  # no exception: the states wait
        assert service.engine.states == {}
        service.hook(round_at(t0 + 10, [HOT, COOL]))  # still down: the round is postponed, not a crash
        private_pg_server.start()
        service.hook(round_at(t0 + 20, [HOT, COOL]))
        [again] = [s for s in service.engine.states.values() if s.state == "firing"]
        assert (again.fingerprint, again.fired_at) == (fired.fingerprint, fired.fired_at)  # resumed, not re-fired
    finally:
        db.close()


@pytest.mark.empty_store
def test_the_worker_waits_for_the_schema_in_one_line(db_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A database that answers before it is migrated: the worker says so once, without a traceback, and delivers
    once the schema is there (as the writer waits for it)."""
    caplog.set_level("INFO", logger="gpulens")
    bare = Database(db_url)  # reachable, not migrated: no notification_outbox table yet
    passes: list[Any] = []
    with flaky_receiver([]) as (url, receiver):
        delivery = Delivery(
            SqlOutbox(bare), {"hook": WebhookNotifier(url, name="hook", timeout_s=5.0)}, clock=SystemClock()
        )
        worker = NotificationWorker(delivery, poll_s=0.05, on_pass=passes.append)
        worker.start()
        try:
            wait_until(lambda: sum("no schema yet" in r.getMessage() for r in caplog.records) >= 1)
            for _ in range(3):  # more passes against the missing table
                worker.wake()
                time.sleep(0.1)
            bare.upgrade()
            payload = {"receiver": "hook", "group_key": "g", "group_labels": {}, "status": "firing", "alerts": []}
            SqlOutbox(bare).enqueue("hook", {**payload, "created_at": 0}, time.time())
            worker.wake()
            wait_until(lambda: receiver.received)
        finally:
            worker.stop()
            bare.close()
    waits = [r for r in caplog.records if "no schema yet" in r.getMessage()]
    assert len(waits) == 1
    assert "\n" not in waits[0].getMessage()
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= 40]  # no traceback, no ERROR
    assert [r.getMessage() for r in caplog.records if "reachable again" in r.getMessage()]
