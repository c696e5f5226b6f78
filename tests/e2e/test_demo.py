"""`gpulens demo` end to end: real processes, live data over HTTP, the stall alert at a local webhook receiver, the
dashboard in headless Chromium, and a clean stop on SIGINT that leaves no process behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from tests.conftest import free_port, http_get
from tests.dashboard.browser import chromium


class Receiver(BaseHTTPRequestHandler):
    payloads: ClassVar[list[dict[str, object]]] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        Receiver.payloads.append(json.loads(body))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


@pytest.fixture
def receiver() -> Iterator[str]:
    Receiver.payloads = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()
    server.server_close()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie waiting for its parent counts as gone
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "zombie" not in status.read_text()


def wait_until(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_demo_runs_the_whole_stack_and_stops_cleanly(receiver: str, tmp_path: Path) -> None:
    port = free_port()
    workdir = tmp_path / "demo"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpulens.cli",
            "demo",
            "--speed",
            "10",  # the stall begins 24 s in: time for the collector to learn the job's traffic first
            "--port",
            str(port),
            "--workdir",
            str(workdir),
            "--webhook-url",
            receiver,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()

    def started() -> str | None:
        text = "".join(lines)
        assert proc.poll() is None, f"the demo exited during start-up:\n{text[-2000:]}"
        return text if "Press Ctrl-C" in text else None

    try:
        text = wait_until(started, 180, "the demo to start")
        exporter = re.search(r"exporters\s+(http://\S+/metrics)", text)
        assert exporter, text
        assert f"http://127.0.0.1:{port}" in text
        # live data over HTTP: the exporters serve, the collector stores, the dashboard answers
        status, _, body = http_get(exporter.group(1))
        assert status == 200
        assert b"gpulens_gpu_utilization_ratio" in body

        # the stall alert reaches the webhook receiver (Alertmanager's version-4 payload)
        def stall() -> dict[str, object] | None:
            for payload in Receiver.payloads:
                for alert in payload["alerts"]:  # type: ignore[union-attr]
                    if alert["labels"]["alertname"] == "CommunicationStall" and alert["status"] == "firing":
                        return alert  # type: ignore[no-any-return]
            return None

        alert = wait_until(stall, 150, "the CommunicationStall notification")
        assert alert["labels"]["job_id"] == "llm-pretrain"  # type: ignore[index]
        assert "no NVLink traffic" in alert["annotations"]["summary"]  # type: ignore[index]
        # what the on-call engineer reads: where the job runs, and what to do
        nodes = alert["labels"]["nodes"].split(",")  # type: ignore[index]
        assert nodes == sorted(nodes)
        assert all(n.startswith("node-") for n in nodes)
        assert alert["annotations"]["runbook"].startswith("The job makes no progress")  # type: ignore[index]
        # the dashboard in a real browser, with the stalled job flagged
        with chromium() as browser:
            page = browser.new_page()
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(f"http://127.0.0.1:{port}/jobs", wait_until="networkidle")
            page.wait_for_selector("text=llm-pretrain", timeout=30_000)
            assert errors == []
        pids = [int(p) for p in (workdir / "pids").read_text().split()]
        assert len(pids) == 6  # four exporters, the collector, the dashboard
        assert all(alive(pid) for pid in pids)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        finally:
            reader.join(timeout=5)
            proc.stdout.close()  # type: ignore[union-attr]
    assert proc.returncode == 0, "".join(lines)[-2000:]
    assert "stopped." in "".join(lines)
    assert not [pid for pid in pids if alive(pid)]


def one_node(tmp_path: Path) -> Path:
    scenario = tmp_path / "one.toml"
    cluster = 'nodes = ["node-00"]\ngpus_per_node = 2\ngpu_model = "H100-SXM5-80GB"\nduration = "60m"\nstep = "10s"'
    scenario.write_text(f"[cluster]\n{cluster}\n", encoding="utf-8")
    return scenario


def test_a_process_that_exits_during_start_up_stops_the_demo_at_once(tmp_path: Path) -> None:
    """The dashboard cannot listen (its port is held): the demo stops within seconds, saying why in one line."""
    import socket

    from gpulens.cli import demo_stack

    scenario = one_node(tmp_path)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        options = demo_stack.DemoOptions(
            scenario=scenario, speed=20, port=squatter.getsockname()[1], workdir=tmp_path / "demo"
        )
        started = time.monotonic()
        with pytest.raises(RuntimeError, match=r"^dashboard exited during start-up: .*cannot listen"):
            demo_stack.start_demo(options, lambda line: None)
        assert time.monotonic() - started < demo_stack.STARTUP_S
