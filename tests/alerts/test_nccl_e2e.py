"""End to end: a simulated hang with a stuck rank, read through each node's RAS reader, judged by the alert service
(SQLite and PostgreSQL), delivered to a webhook receiver on 127.0.0.1 that gets the rank named."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

from gpulens.alerts.config import parse_alerting
from gpulens.alerts.service import AlertService
from gpulens.clock import SystemClock
from gpulens.config import format_timestamp
from gpulens.exporter.sim import SimCluster, parse_scenario
from gpulens.model import TargetHealth
from gpulens.rounds import RoundResult
from gpulens.storage.db import Database
from tests.alerts.receivers import serve
from tests.alerts.test_worker import wait_until
from tests.storage.conftest import _pg_root, clock, db, db_url, pg_server, private_pg_server

__all__ = ["_pg_root", "clock", "db", "db_url", "pg_server", "private_pg_server"]  # the storage tests' fixtures


class _Capture(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        state: dict[str, Any] = self.server.state  # type: ignore[attr-defined]
        doc = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        with state["lock"]:
            state["docs"].append(doc)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


def _scenario(start: float) -> str:
    return f"""
[cluster]
nodes = 2
gpus_per_node = 8
gpu_model = "H100-SXM5-80GB"
seed = 5
start = "{format_timestamp(start)}"
duration = "20m"
step = "10s"

[[jobs]]
id = "llm-pretrain"
user = "alice"
kind = "training"
gpus = ["node-00:0-7", "node-01:0-7"]
nccl_version = "2.26.2"

[[faults]]
kind = "hang_spinning"
job = "llm-pretrain"
at = "12m"
stuck_ranks = ["node-01:6"]
"""


def test_a_simulated_hang_reaches_the_webhook_naming_the_stuck_rank(db: Database) -> None:
    start = time.time() - 20 * 60
    start -= start % 10
    scenario = parse_scenario(_scenario(start), source="e2e")
    cluster = SimCluster(scenario)
    config = parse_alerting(
        {
            "receivers": [{"name": "hook", "kind": "webhook", "url_env": "HOOK_URL"}],
            "routes": [{"receiver": "hook", "group_by": ["..."], "group_wait": "0s", "group_interval": "0s"}],
        }
    )
    state: dict[str, Any] = {"docs": [], "lock": threading.Lock()}
    with serve(_Capture, state) as url:
        service = AlertService(db, config, clock=SystemClock(), environ={"HOOK_URL": url}, poll_s=0.1).start()
        try:
            for k in range(int(scenario.duration_s / scenario.step_s)):
                t = scenario.start + k * scenario.step_s
                snaps = [cluster.snapshot(n, t) for n in cluster.node_names()]
                targets = [TargetHealth(n, f"sim://{n}", "gpulens", t, True, node=n) for n in cluster.node_names()]
                service.hook(RoundResult(time=t, snapshots=snaps, targets=targets, written=True))

            def stall() -> list[dict[str, Any]]:
                with state["lock"]:
                    alerts = [a for d in state["docs"] for a in d.get("alerts", [])]
                return [a for a in alerts if a["labels"].get("alertname") == "CommunicationStall"]

            [alert, *_] = wait_until(stall)
        finally:
            service.close()
    assert alert["labels"]["signature"] == "rank_missing"
    assert alert["labels"]["job_id"] == "llm-pretrain"
    assert "rank 14 (node-01 GPU 6 pid " in alert["annotations"]["stuck_ranks"]
    assert "AllReduce" in alert["annotations"]["summary"]
