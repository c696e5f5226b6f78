"""The collector's own /metrics: TLS and basic auth from a web config (the exporter's format), through the real
``gpulens collector`` process and a real HTTPS client; the outbox backlog and the interval among its families."""

from __future__ import annotations

import base64
import dataclasses
import os
import signal
import ssl
import subprocess
import sys
from pathlib import Path

import bcrypt
import trustme
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpulens.clock import ManualClock
from gpulens.collector.loop import Collector
from gpulens.settings import default_settings
from gpulens.storage import remediationstore
from gpulens.storage.alertstore import outbox_enqueue
from gpulens.storage.db import Database
from tests.collector.test_startup import ROOT, wait_until
from tests.conftest import free_port, http_get
from tests.dbtemplate import migrated_sqlite


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def _get(url: str, context: ssl.SSLContext, headers: dict[str, str] | None = None) -> int | None:
    try:
        return http_get(url, headers=headers, timeout=2, context=context)[0]
    except OSError:
        return None  # not listening yet


def test_the_collector_serves_its_metrics_over_tls_with_basic_auth(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "server.key"))
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n"
        f"basic_auth_users:\n  prometheus: '{hashed}'\n"
    )
    port = free_port()
    url = f"https://127.0.0.1:{port}/metrics"
    command = ["collector", "--db", migrated_sqlite(tmp_path / "c.db"), "--interval", "1s"]
    command += ["--target", f"http://127.0.0.1:{free_port()}"]  # a node that is down: the rounds still run
    command += ["--listen", f"127.0.0.1:{port}", "--web-config", str(web), "--spool-dir", str(tmp_path / "spool")]
    process = subprocess.Popen(
        [sys.executable, "-m", "gpulens.cli", *command],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    client = ssl.create_default_context()
    ca.configure_trust(client)
    try:
        assert wait_until(lambda: _get(url, client), 60, "the collector's /metrics") == 401  # no credentials
        assert _get(url, client, _basic("prometheus", "wrong")) == 401
        status, headers, body = http_get(url, headers=_basic("prometheus", "s3cret"), context=client)
        assert status == 200
        assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
        names = {f.name for f in text_string_to_metric_families(body.decode())}
        assert {"gpulens_collector_interval_seconds", "gpulens_collector_outbox_pending"} <= names
        plain = ssl.create_default_context()  # a client that does not trust the test CA fails the handshake
        assert _get(url, plain, _basic("prometheus", "s3cret")) is None
        assert _get(url, client, _basic("prometheus", "s3cret")) == 200  # ... and the server keeps serving
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr
    assert f"its metrics at https://127.0.0.1:{port}/metrics (basic auth)" in stdout + stderr
    assert "s3cret" not in stdout + stderr
    assert hashed not in stdout + stderr


def test_the_outbox_backlog_the_interval_and_the_brake_are_exported(tmp_path: Path) -> None:
    clock = ManualClock(1_800_000_000.0)
    url = migrated_sqlite(tmp_path / "o.db")
    db = Database(url, clock=clock)
    settings = dataclasses.replace(
        default_settings(environ={}), db_url=url, interval_s=10.0, spool_dir=str(tmp_path / "spool")
    )
    collector = Collector(settings, db, clock=clock)

    def gauges() -> dict[str, float]:
        text = generate_latest(collector.metrics.registry).decode()
        return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}

    try:
        collector.run_round()
        assert gauges()["gpulens_collector_outbox_pending"] == 0
        assert gauges()["gpulens_collector_outbox_oldest_pending_age_seconds"] == 0
        assert gauges()["gpulens_collector_interval_seconds"] == 10
        outbox_enqueue(db, "slack", {"group_key": "a"}, clock.now())
        outbox_enqueue(db, "slack", {"group_key": "b"}, clock.now() + 100)
        clock.advance(700)
        collector.run_round()
        assert gauges()["gpulens_collector_outbox_pending"] == 2
        assert gauges()["gpulens_collector_outbox_oldest_pending_age_seconds"] == 700
        assert gauges()["gpulens_collector_remediation_halted"] == 0
        remediationstore.halt(db, clock.now(), "11 of 100 nodes wanted drained")  # the brake, in the store
        clock.advance(30)
        collector.run_round()
        assert gauges()["gpulens_collector_remediation_halted"] == 1
    finally:
        collector.close()
        db.close()
