"""The HA pair in one process: two collectors with the same targets on one PostgreSQL store, one active; while
the database is down, and on SQLite (no pair).

Two identical collectors each writing and each running the rules store every reading twice and notify every alert
twice; paired, only the holder of the advisory lock scrapes, writes, evaluates and enqueues. When its lock
connection dies, the standby takes over at its next round and resumes the stored alert states: a firing alert is
not notified again, and its resolution is notified once."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import sqlalchemy as sa

from gpulens.alerts.config import parse_alerting
from gpulens.alerts.service import AlertService
from gpulens.collector.loop import Collector
from gpulens.collector.pair import WhileActive, pair_key
from gpulens.settings import TargetSettings, default_settings
from gpulens.storage import alertstore, schema
from gpulens.storage.db import Database
from tests.collector.live import GPUS, Fault, live_exporter
from tests.dbtemplate import migrated_sqlite
from tests.storage.conftest import PgServer

ALERTING = {
    "builtin": {"Watchdog": {"enabled": False}},  # the tests count one rule's alerts and notifications
    "rules": [
        {"name": "GpuHot", "field": "temperature_celsius", "op": ">=", "threshold": 80, "for": "0s"},
    ],
    "receivers": [{"name": "hook", "kind": "webhook", "url_env": "HOOK_URL"}],
    "routes": [{"receiver": "hook", "group_wait": "0s", "group_interval": "0s"}],
}


@dataclasses.dataclass
class Member:
    db: Database
    collector: Collector
    rules: WhileActive

    def leader(self) -> float | None:
        return self.collector.metrics.registry.get_sample_value("gpulens_collector_leader")


def make_pair(url: str, exporter: str, folder: Path, stack: ExitStack) -> tuple[Member, Member]:
    """Two collectors with the same settings, each with its own connections to ``url``, closed by ``stack``."""
    config = parse_alerting(ALERTING)
    members = []
    for i in range(2):
        db = Database(url)
        settings = dataclasses.replace(
            default_settings(environ={}),
            db_url=url,
            targets=(TargetSettings(url=exporter, name="node-00"),),
            interval_s=1.0,
            timeout_s=0.5,
            spool_dir=str(folder / f"spool{i}"),
        )
        # Not started: no worker thread; what would be sent is what the outbox holds.
        rules = WhileActive(
            lambda db=db: AlertService(
                db, config, environ={"HOOK_URL": "http://127.0.0.1:9/"}, load_at_first_round=True
            )
        )
        collector = Collector(settings, db, hooks=[rules])
        stack.callback(db.close)
        stack.callback(collector.close)
        members.append(Member(db, collector, rules))
    return members[0], members[1]


@pytest.fixture
def pair(pg_server: PgServer, tmp_path: Path) -> Iterator[tuple[Member, Member, Fault]]:
    url = pg_server.url(pg_server.create_database(migrated=True))
    fault = Fault()
    with live_exporter(fault) as exporter, ExitStack() as stack:
        yield (*make_pair(url, exporter, tmp_path, stack), fault)


def stored(db: Database) -> tuple[int, int]:
    """(rows of gpu_sample, firing transitions in alert_history)."""
    with db.session() as s:
        rows = s.execute(sa.select(sa.func.count()).select_from(schema.gpu_sample)).scalar_one()
        firing = s.execute(sa.text("SELECT count(*) FROM alert_history WHERE state = 'firing'")).scalar_one()
    return int(rows), int(firing)


def notified(db: Database) -> list[str]:
    """The status each incident was told with, message by message (a message may tell of several)."""
    return [
        str(item.payload["status"])
        for item in alertstore.outbox_items(db)
        for _ in item.payload.get("incidents") or [item.payload["group_key"]]
    ]


def test_one_of_a_pair_writes_and_alerts_and_the_other_takes_over(
    pair: tuple[Member, Member, Fault], pg_server: PgServer
) -> None:
    a, b, fault = pair
    for r in range(4):
        fault.on = r >= 1
        assert a.collector.run_round().leading
        assert not b.collector.run_round().leading
    assert (a.leader(), b.leader()) == (1.0, 0.0)
    assert (a.rules.running, b.rules.running) == (True, False)
    assert stored(a.db) == (4 * GPUS, GPUS)  # each reading once; each GPU's alert fired once
    assert notified(a.db) == ["firing"] * GPUS  # each hot GPU is a fault of its own, told once
    assert len(alertstore.outbox_items(a.db)) == 1  # all in one message: they fired in the same round
    # The active collector's lock connection dies (as when its host goes away): the standby takes over at its next
    # round, and the other one learns at its own next round that it lost the lock.
    key = pair_key(a.collector._settings) & 0xFFFFFFFFFFFFFFFF  # pg_locks shows the key's two 32-bit halves
    held = (
        "FROM pg_locks WHERE locktype = 'advisory' AND granted AND classid::text = %s AND objid::text = %s",
        (str(key >> 32), str(key & 0xFFFFFFFF)),
    )
    with pg_server.admin() as admin:
        assert admin.execute(f"SELECT pg_terminate_backend(pid) {held[0]}", held[1]).fetchall() == [(True,)]
        while admin.execute(f"SELECT count(*) {held[0]}", held[1]).fetchone() != (0,):  # the backend exits
            time.sleep(0.05)
    assert b.collector.run_round().leading
    assert not a.collector.run_round().leading
    assert (a.leader(), b.leader()) == (0.0, 1.0)
    assert (a.rules.running, b.rules.running) == (False, True)
    assert stored(b.db) == (5 * GPUS, GPUS)  # the firing alerts resumed from the store: not fired again
    assert notified(b.db) == ["firing"] * GPUS
    fault.on = False
    assert b.collector.run_round().leading
    assert notified(b.db) == ["firing"] * GPUS + ["resolved"] * GPUS


def test_while_the_database_is_down_the_active_one_spools_and_the_standby_waits(
    private_pg_server: PgServer, tmp_path: Path
) -> None:
    url = private_pg_server.url(private_pg_server.create_database(migrated=True))
    with live_exporter() as exporter, ExitStack() as stack:
        a, b = make_pair(url, exporter, tmp_path, stack)
        assert a.collector.run_round().leading
        assert not b.collector.run_round().leading
        private_pg_server.stop()  # every session ends: the lock is free once the server is back
        down_a, down_b = a.collector.run_round(), b.collector.run_round()
        assert (down_a.leading, down_a.spooled, down_b.leading, down_b.spooled) == (True, True, False, False)
        assert a.collector.spool.depth == 1
        assert b.collector.spool.depth == 0
        private_pg_server.start()
        back = a.collector.run_round()  # the first to ask takes the lock again, and replays its spool
        assert (back.leading, back.written, back.replayed) == (True, True, 1)
        assert not b.collector.run_round().leading
        assert stored(a.db)[0] == 3 * GPUS  # every round once: none lost, none written by the standby


def test_on_sqlite_a_collector_runs_alone(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    url = migrated_sqlite(tmp_path / "gpulens.db")
    with live_exporter() as exporter, ExitStack() as stack:
        a, _ = make_pair(url, exporter, tmp_path, stack)
        with caplog.at_level(logging.INFO, logger="gpulens.storage.leader"):
            assert a.collector.run_round().leading
            assert a.collector.run_round().leading
        assert a.leader() == 1.0
        assert [r.getMessage() for r in caplog.records] == [
            "this collector runs alone: an HA pair needs a PostgreSQL store, not SQLite"
        ]
        assert stored(a.db)[0] == 2 * GPUS
