"""The collector end to end over real HTTP: simulated exporters and misbehaving targets into SQLite and PostgreSQL,
a database outage survived through the spool, and a restart that resumes where it left off."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import sqlalchemy as sa
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpulens.alerts.config import AlertingConfig
from gpulens.alerts.rules import builtin_rules
from gpulens.alerts.service import AlertService
from gpulens.clock import ManualClock
from gpulens.collector.loop import Collector
from gpulens.exporter.endpoints import Routes, exporter_server
from gpulens.exporter.poller import OnDemandNode
from gpulens.exporter.sim import LiveTime, SimAllNodes, SimCluster, parse_scenario
from gpulens.settings import TargetSettings, default_settings
from gpulens.storage import inventory, jobstats, latest, schema, timeseries
from gpulens.storage.db import Database
from tests.conftest import free_port
from tests.dbtemplate import migrated_sqlite
from tests.storage.conftest import PgServer

SCENARIO = """
[cluster]
nodes = 3
gpus_per_node = 4
gpu_model = "H100-SXM5-80GB"
seed = 4
start = "2026-01-01T00:00:00Z"
duration = "60m"
step = "10s"

[[jobs]]
id = "train"
user = "alice"
kind = "training"
gpus = ["node-00:0-3", "node-01:0-3"]
"""


class Broken(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.startswith("/hang"):
            time.sleep(2)
        body = b"<html>login</html>" if self.path.startswith("/garbage") else b"oops"
        self.send_response(200 if self.path.startswith("/garbage") else 500)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        """Clients that time out are expected."""


@pytest.fixture
def cluster() -> Iterator[tuple[str, ManualClock]]:
    """A 3-node simulated cluster served by one --all-nodes exporter, on a clock the test moves."""
    scenario = parse_scenario(SCENARIO)
    real = ManualClock(time.time())
    live = LiveTime(scenario.start, 1.0, clock=real)
    multi = SimAllNodes(SimCluster(scenario, stamp=live.to_real), live)
    server = exporter_server(
        Routes(nodes={n: OnDemandNode(multi, n) for n in multi.node_names()}), host="127.0.0.1", port=0
    )
    server.start()
    yield f"http://127.0.0.1:{server.port}", real
    server.close()


@pytest.fixture
def broken() -> Iterator[str]:
    server = QuietServer(("127.0.0.1", 0), Broken)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def rows_written(collector: Collector, table: str) -> float:
    value = collector.metrics.registry.get_sample_value("gpulens_collector_rows_written_total", {"table": table})
    return value or 0.0


def settings_for(db_url: str, targets: list[str], tmp_path: Path, **changes: object):  # type: ignore[no-untyped-def]
    base = default_settings(environ={})
    return dataclasses.replace(
        base,
        db_url=db_url,
        targets=tuple(TargetSettings(url=u, name=u) for u in targets),
        timeout_s=0.5,
        interval_s=10.0,
        spool_dir=str(tmp_path / "spool"),
        **changes,
    )


def test_rounds_land_in_the_store_and_bad_targets_never_hold_up_the_others(
    db_url: str, cluster: tuple[str, ManualClock], broken: str, tmp_path: Path
) -> None:
    base, real = cluster
    targets = [f"{base}/node/node-0{i}" for i in range(3)]
    bad = [f"{broken}/hang", f"{broken}/error", f"{broken}/garbage", f"http://127.0.0.1:{free_port()}"]
    db = Database(db_url)
    db.upgrade()
    collector = Collector(settings_for(db_url, targets + bad, tmp_path), db)
    try:
        rounds = []
        for _ in range(3):
            started = time.monotonic()
            rounds.append(collector.run_round())
            assert time.monotonic() - started < 5  # the hanging target costs its 0.5 s timeout, in parallel
            real.advance(10)
        assert all(r.written for r in rounds)
        readings = latest.latest_readings(db)
        assert len(readings) == 12
        assert {g.node for g in readings} == {"node-00", "node-01", "node-02"}
        health = {t.target: t for t in inventory.target_health(db)}
        assert all(health[t].up for t in targets)
        assert not any(health[t].up for t in bad)
        assert "timed out" in (health[f"{broken}/hang"].last_error or "")
        assert "HTTP 500" in (health[f"{broken}/error"].last_error or "")
        assert "refused" in (health[bad[3]].last_error or "")
        series = timeseries.series(db, [readings[0].uuid], ["utilization_ratio"], real.now() - 60, real.now(), 100)
        assert len(series[readings[0].uuid].timestamps) == 3  # three rounds, one row each: no duplicates
        jobs = {j.job_id: j for j in jobstats.jobs(db, real.now() - 3600, real.now())}
        assert len(jobs["train"].gpus) == 8
        exposition = generate_latest(collector.metrics.registry).decode()
        metrics = {f.name: f for f in text_string_to_metric_families(exposition)}
        targets_by_state = {s.labels["state"]: s.value for s in metrics["gpulens_collector_targets"].samples}
        assert targets_by_state == {"up": 3.0, "down": 4.0}
    finally:
        collector.close()
        db.close()


def test_the_same_round_stored_twice_is_one_row(db_url: str, cluster: tuple[str, ManualClock], tmp_path: Path) -> None:
    base, real = cluster
    db = Database(db_url)
    db.upgrade()
    collector = Collector(settings_for(db_url, [f"{base}/node/node-00"], tmp_path), db)
    try:
        collector.run_round()
        collector.run_round()  # same simulation step: the same (GPU, timestamp) readings again
        uuid = latest.latest_readings(db)[0].uuid
        s = timeseries.series(db, [uuid], ["power_watts"], real.now() - 600, real.now() + 600, 100)
        assert len(s[uuid].timestamps) == 1
    finally:
        collector.close()
        db.close()


def test_postgres_outage_is_spooled_and_replayed_exactly_once(
    private_pg_server: PgServer, cluster: tuple[str, ManualClock], tmp_path: Path
) -> None:
    base, real = cluster
    url = private_pg_server.url(private_pg_server.create_database())
    db = Database(url)
    db.upgrade()
    settings = settings_for(url, [f"{base}/node/node-0{i}" for i in range(3)], tmp_path)
    collector = Collector(settings, db)
    stamps = []
    try:
        for i in range(6):
            if i == 2:
                private_pg_server.stop()
            if i == 4:
                private_pg_server.start()
            result = collector.run_round()
            stamps.append(result.snapshots[0].timestamp)
            assert result.written == (i not in (2, 3))
            assert result.spooled == (i in (2, 3))
            if i == 4:
                assert result.replayed == 2
            real.advance(10)
        assert collector.spool.depth == 0
        uuid = next(g.uuid for g in latest.latest_readings(db) if g.node == "node-00")
        s = timeseries.series(db, [uuid], ["utilization_ratio"], stamps[0] - 1, stamps[-1] + 1, 1000)
        stored = list(s[uuid].timestamps)  # bucket starts: the stored times floored to the bucket
        assert len(stored) == len(stamps)  # every round exactly once
        assert all(0 <= b - a < 1 for a, b in zip(stored, stamps, strict=True))  # in order
        with db.session() as session:
            stored_rows = session.execute(sa.select(sa.func.count()).select_from(schema.gpu_sample)).scalar_one()
        assert stored_rows == 6 * 12
        # rows replayed from the spool are written rows too: the counter agrees with the table
        assert rows_written(collector, "gpu_sample") == stored_rows
    finally:
        collector.close()
        db.close()


def test_a_killed_collector_replays_its_spool_when_it_starts_again(
    cluster: tuple[str, ManualClock], tmp_path: Path
) -> None:
    base, real = cluster
    url = migrated_sqlite(tmp_path / "g.db")
    settings = settings_for(url, [f"{base}/node/node-01"], tmp_path)
    db = Database(url)
    first = Collector(settings, db)
    first.spool.append(first.run_round().snapshots, [])  # a round that was spooled when the process died
    first.close()
    db.close()
    real.advance(10)
    db = Database(url)
    again = Collector(settings, db)
    try:
        result = again.run_round()
        assert result.replayed == 1
        assert again.spool.depth == 0
    finally:
        again.close()
        db.close()


def test_the_alert_engine_runs_after_each_round_and_survives_a_restart(
    cluster: tuple[str, ManualClock], broken: str, tmp_path: Path
) -> None:
    base, real = cluster
    url = migrated_sqlite(tmp_path / "g.db")
    dead = f"http://127.0.0.1:{free_port()}"
    settings = settings_for(url, [f"{base}/node/node-00", dead], tmp_path)
    config = AlertingConfig(rules=tuple(builtin_rules()))

    def run(rounds: int) -> AlertService:
        db = Database(url)
        service = AlertService(db, config, notifiers={})
        collector = Collector(settings, db, clock=real, hooks=[service.hook])
        try:
            for _ in range(rounds):
                collector.run_round()
                real.advance(10)
        finally:
            collector.close()
        return service

    service = run(9)  # ExporterDown has `for` 1m
    firing = {s.rule: s for s in service.engine.states.values() if s.state == "firing"}
    assert "ExporterDown" in firing
    again = run(1)  # a restarted collector remembers the firing alert and does not notify it again
    states = {s.rule: s for s in again.engine.states.values()}
    assert states["ExporterDown"].state == "firing"
    assert states["ExporterDown"].fired_at == firing["ExporterDown"].fired_at


def test_rollups_are_built_between_rounds_in_short_steps(cluster: tuple[str, ManualClock], tmp_path: Path) -> None:
    """The loop rolls up finished minutes after each round (storage's stepped rollups), not in a separate run."""
    base, real = cluster
    url = migrated_sqlite(tmp_path / "r.db")
    db = Database(url, clock=real)
    collector = Collector(settings_for(url, [f"{base}/node/node-00"], tmp_path), db, clock=real)
    try:
        for _ in range(15):  # two and a half minutes of 10 s rounds
            collector.run_round()
            real.advance(10)
    finally:
        collector.close()
    with db.engine.connect() as conn:
        minutes = conn.execute(sa.text("SELECT count(DISTINCT ts_ms) FROM gpu_rollup_1m")).scalar_one()
        raw = conn.execute(sa.text("SELECT count(*) FROM gpu_sample")).scalar_one()
    db.close()
    assert raw > 0
    assert minutes >= 1  # at least one whole minute has been rolled up by the loop


def test_a_late_round_is_counted_logged_once_and_made_up(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A round that runs past its ticks (a hook held until three ticks were skipped): each skipped tick is counted,
    one line says so (APScheduler's own line never shows), and rounds go on."""
    caplog.set_level("INFO")
    url = f"sqlite:///{tmp_path / 'late.db'}"
    db = Database(url)
    db.upgrade()
    settings = dataclasses.replace(settings_for(url, [], tmp_path), interval_s=0.2, timeout_s=0.1)
    collector = Collector(settings, db)
    skipped = collector.metrics.rounds_skipped

    def skipped_ticks() -> float:
        return collector.metrics.registry.get_sample_value("gpulens_collector_rounds_skipped_total") or 0.0

    rounds: list[float] = []
    late_ended: list[float] = []

    def hook(result: object) -> None:
        rounds.append(time.monotonic())
        if len(rounds) == 2:  # the second round is late: it waits until three ticks went by
            deadline = time.monotonic() + 30
            while skipped_ticks() < 3 and time.monotonic() < deadline:
                time.sleep(0.02)
            late_ended.append(time.monotonic())

    collector.add_hook(hook)
    stop = threading.Event()
    runner = threading.Thread(target=collector.run, args=(stop,), daemon=True)
    runner.start()
    try:
        deadline = time.monotonic() + 30
        while len(rounds) < 6 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        stop.set()
        runner.join(timeout=10)
        collector.close()
        db.close()
    assert len(rounds) >= 6
    assert skipped_ticks() >= 3
    assert skipped is collector.metrics.rounds_skipped
    lines = [r for r in caplog.records if "next tick was skipped" in r.getMessage()]
    assert len(lines) == 1
    assert not [r for r in caplog.records if "maximum number of running instances" in r.getMessage()]
    assert late_ended
