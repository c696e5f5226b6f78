"""Alerts never block scraping: a 1 s collector on PostgreSQL, with one notification receiver that never answers and
one that drips its answer, stores every round on time while the alert engine notifies both every round."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import sqlalchemy as sa

from gpulens.alerts.config import parse_alerting
from gpulens.alerts.service import AlertService
from gpulens.collector.loop import Collector
from gpulens.rounds import RoundResult
from gpulens.settings import TargetSettings, default_settings
from gpulens.storage import alertstore, schema
from gpulens.storage.db import Database
from tests.alerts.receivers import drip_receiver, hanging_receiver
from tests.collector.live import GPUS, live_exporter
from tests.storage.conftest import PgServer

SECONDS = 8


def stored_rounds(db: Database) -> int:
    with db.session() as s:
        rows = s.execute(sa.select(sa.func.count()).select_from(schema.gpu_sample)).scalar_one()
    return int(rows) // GPUS


def test_a_hanging_and_a_dripping_receiver_never_delay_a_round(pg_server: PgServer, tmp_path: Path) -> None:
    url = pg_server.url(pg_server.create_database())
    db = Database(url)
    db.upgrade()
    config = parse_alerting(
        {
            "rules": [
                {
                    "name": "GpuHot",
                    "field": "temperature_celsius",
                    "op": ">=",
                    "threshold": 80,
                    "for": "0s",
                    "severity": "warning",
                }
            ],
            "receivers": [
                {"name": "hang", "kind": "webhook", "url_env": "HANG_URL", "timeout": "10s"},
                {"name": "drip", "kind": "webhook", "url_env": "DRIP_URL", "timeout": "10s"},
            ],
            "routes": [
                {"receiver": "hang", "group_wait": "0s", "group_interval": "0s", "continue": True},
                {"receiver": "drip", "group_wait": "0s", "group_interval": "0s"},
            ],
        }
    )
    with live_exporter() as exporter, hanging_receiver() as hang, drip_receiver() as drip:
        settings = dataclasses.replace(
            default_settings(environ={}),
            db_url=url,
            targets=(TargetSettings(url=exporter, name="node-00"),),
            interval_s=1.0,
            timeout_s=0.5,
            spool_dir=str(tmp_path / "spool"),
        )
        service = AlertService(db, config, environ={"HANG_URL": hang, "DRIP_URL": drip}).start()
        collector = Collector(settings, db, hooks=[service])
        rounds: list[RoundResult] = []
        stop = threading.Event()
        thread = threading.Thread(target=collector.run, args=(stop,), kwargs={"on_round": rounds.append})
        started = time.monotonic()
        thread.start()
        try:
            time.sleep(SECONDS)
        finally:
            stop.set()
            thread.join(timeout=30)
            elapsed = time.monotonic() - started
            closing = time.monotonic()
            service.close()
            closed_in = time.monotonic() - closing
            collector.close()
    try:
        assert not thread.is_alive()
        assert closed_in < 5.0  # the worker stops within 5 s, a send in flight or not
        # Every round ran on time (one a second) and was stored: no receiver held the loop.
        assert abs(len(rounds) - int(elapsed)) <= 1, (len(rounds), elapsed)
        # A round that the stop cut short mid-scrape stores nothing by design (it has no targets): at most the last.
        assert all(r.targets for r in rounds[:-1])
        assert all(r.written for r in rounds if r.targets)
        assert abs(stored_rounds(db) - len(rounds)) <= 1
        # ... while the engine did notify both receivers, every round (the rule flips each scrape).
        receivers = {item.receiver for item in alertstore.outbox_items(db)}
        assert receivers == {"hang", "drip"}
        assert len(alertstore.outbox_items(db)) >= len(rounds)
    finally:
        db.close()
