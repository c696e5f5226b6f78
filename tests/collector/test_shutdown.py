"""A slow target holds nothing up: SIGTERM stops the collector and the exporter within 5 s while a target drips its
answer one byte a second, and the exporter answers /healthz ("starting") before its first collection ends."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port, http_get

STOP_BUDGET_S = 5.0


class _Drip(BaseHTTPRequestHandler):
    server: _DripServer

    def do_GET(self) -> None:
        self.server.asked.set()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", "100000")
        self.end_headers()
        try:
            for _ in range(600):
                self.wfile.write(b"#")
                self.wfile.flush()
                if self.server.closing.wait(1.0):
                    return
        except OSError:
            return

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


class _DripServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Drip)
        self.asked = threading.Event()
        self.closing = threading.Event()


@pytest.fixture
def dripping() -> Iterator[_DripServer]:
    server = _DripServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.closing.set()
        server.shutdown()
        server.server_close()


def _stop_within_budget(process: subprocess.Popen[str]) -> float:
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        process.communicate(timeout=STOP_BUDGET_S + 5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail(f"still running {STOP_BUDGET_S + 5:g}s after SIGTERM")
    return time.monotonic() - started


def _gpulens(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpulens.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_sigterm_stops_the_collector_within_5s_while_a_target_drips(dripping: _DripServer, tmp_path: Path) -> None:
    config = tmp_path / "gpulens.toml"
    config.write_text(
        f'[database]\nurl = "sqlite:///{tmp_path / "g.db"}"\n\n'
        '[collector]\ninterval = "60s"\ntimeout = "60s"\n'
        f'listen = "127.0.0.1:{free_port()}"\nspool_dir = "{tmp_path / "spool"}"\n\n'
        f'[[targets]]\nurl = "http://127.0.0.1:{dripping.server_address[1]}/metrics"\nkind = "dcgm"\n'
    )
    process = _gpulens("collector", "--config", str(config))
    try:
        assert dripping.asked.wait(30), "the collector never scraped the target"
        time.sleep(1.0)  # well into the drip, far from its 60 s timeout
        took = _stop_within_budget(process)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0
    assert took <= STOP_BUDGET_S, f"stopped {took:.1f}s after SIGTERM"


def test_the_exporter_says_starting_then_stops_within_5s_while_its_source_drips(
    dripping: _DripServer,
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{dripping.server_address[1]}/metrics"
    process = _gpulens(
        "exporter", "--source", "dcgm", "--dcgm-url", url, "--interval", "60s", "--listen", f"127.0.0.1:{port}"
    )
    try:
        assert dripping.asked.wait(30), "the exporter never read its source"
        deadline = time.monotonic() + 20
        status, body = None, b""
        while time.monotonic() < deadline:
            try:
                status, _, body = http_get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except OSError:
                time.sleep(0.1)
        assert status == 503
        assert json.loads(body)["reason"].startswith("starting")
        took = _stop_within_budget(process)
    finally:
        if process.poll() is None:
            process.kill()
    assert took <= STOP_BUDGET_S, f"stopped {took:.1f}s after SIGTERM"
