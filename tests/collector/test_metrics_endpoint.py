"""The collector's own /metrics as ``serve_metrics`` wires it, over real sockets on 127.0.0.1: its routes and
headers, a bounded pool for slow clients, and bounded bcrypt work for failed logins. (TLS and basic auth through
the real ``gpulens collector`` process: test_selfmetrics.py.)"""

from __future__ import annotations

import base64
import dataclasses
import http.client
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpulens.authguard import AuthLimits
from gpulens.clock import ManualClock
from gpulens.collector.loop import Collector
from gpulens.collector.runner import METRICS_WORKERS, serve_metrics
from gpulens.settings import default_settings
from gpulens.storage.db import Database
from gpulens.webauth import BasicAuth
from gpulens.webconfig import WebConfig
from tests.conftest import http_get
from tests.dbtemplate import migrated_sqlite

SETTINGS = dataclasses.replace(default_settings(environ={}), listen="127.0.0.1:0")


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Collector]:
    clock = ManualClock(1_800_000_000.0)
    url = migrated_sqlite(tmp_path / "m.db")
    db = Database(url, clock=clock)
    collector = Collector(dataclasses.replace(SETTINGS, db_url=url, spool_dir=str(tmp_path / "spool")), db, clock=clock)
    yield collector
    collector.close()
    db.close()


def test_metrics_index_and_404_with_their_headers(collector: Collector) -> None:
    server = serve_metrics(collector, SETTINGS, WebConfig())
    base = f"http://127.0.0.1:{server.port}"
    try:
        status, headers, body = http_get(f"{base}/metrics")
        assert status == 200
        assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert "Cache-Control" not in headers
        assert "gpulens_collector_interval_seconds" in {f.name for f in text_string_to_metric_families(body.decode())}
        status, headers, body = http_get(f"{base}/")
        assert (status, headers["Content-Type"]) == (200, "text/html; charset=utf-8")
        assert body == b'<!doctype html><title>gpulens collector</title><a href="metrics">metrics</a>\n'
        assert http_get(f"{base}/nope")[::2] == (404, b"not found; see /metrics\n")
    finally:
        server.close()


class _Slow:
    """A registry collector that holds each render until released: a scrape that takes long."""

    def __init__(self) -> None:
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()

    def describe(self) -> list[object]:
        return []

    def collect(self) -> Iterator[object]:
        self.entered.release()
        self.release.wait(30)
        return iter(())


def test_slow_clients_share_a_bounded_pool_of_threads(collector: Collector) -> None:
    """METRICS_WORKERS + 8 clients at once whose answers take long make no thread each: the extra ones wait."""
    slow = _Slow()
    collector.metrics.registry.register(slow)  # type: ignore[arg-type]
    before = threading.active_count()
    server = serve_metrics(collector, SETTINGS, WebConfig())
    clients = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(METRICS_WORKERS + 8)]
    try:
        for sock in clients:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        for _ in range(METRICS_WORKERS):  # every worker is rendering
            assert slow.entered.acquire(timeout=30)
        deadline = time.monotonic() + 10
        while server.open_connections < len(clients) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.open_connections == len(clients)
        assert threading.active_count() - before <= METRICS_WORKERS + 2  # the workers, the selector, the accept loop
        slow.release.set()
        for sock in clients:
            response = http.client.HTTPResponse(sock)
            response.begin()
            assert response.status == 200
            assert b"gpulens_collector_interval_seconds" in response.read()
    finally:
        slow.release.set()
        for sock in clients:
            sock.close()
        server.close()


def test_wrong_passwords_cost_a_bounded_number_of_bcrypt_checks(collector: Collector) -> None:
    calls: list[bytes] = []

    def counting(password: bytes, hashed: bytes) -> bool:
        calls.append(hashed)
        return bcrypt.checkpw(password, hashed)

    auth = BasicAuth({"prometheus": bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4))}, checkpw=counting)
    server = serve_metrics(collector, SETTINGS, WebConfig(basic_auth=auth))
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    statuses = set()
    try:
        for i in range(200):
            header = base64.b64encode(f"prometheus:guess{i}".encode()).decode()
            connection.request("GET", "/metrics", headers={"Authorization": f"Basic {header}"})
            response = connection.getresponse()
            response.read()
            statuses.add(response.status)
    finally:
        connection.close()
        server.close()
    assert statuses == {401, 429}
    assert len(calls) <= AuthLimits().burst + 1  # + 1: a token may come back while the 200 requests run
