"""``gpulens alerts list [--json]`` through the real CLI, over a SQLite store holding the engine's alert states."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from gpulens.alerts.config import parse_alerting
from gpulens.alerts.matchers import parse_matcher
from gpulens.alerts.service import AlertService
from gpulens.clock import ScaledClock
from gpulens.model import TargetHealth
from gpulens.storage import alertstore
from gpulens.storage.connect import open_database
from tests.alerts.support import T0, healthy_gpu, snapshot, uuid


def gpulens(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")}
    return subprocess.run(
        [sys.executable, "-m", "gpulens.cli", *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A store where GpuHot fires on node-a (and is silenced on node-c) and GpuWarm is pending on node-b."""
    url = f"sqlite:///{tmp_path_factory.mktemp('list') / 'alerts.db'}"
    config = parse_alerting(
        {
            "rules": [
                {"name": "GpuHot", "field": "temperature_celsius", "threshold": 85, "severity": "critical"},
                {"name": "GpuWarm", "field": "temperature_celsius", "op": "<", "threshold": 60, "for": "10m"},
            ]
        }
    )
    config = replace(config, rules=tuple(r for r in config.rules if r.name in ("GpuHot", "GpuWarm", "Watchdog")))
    db = open_database(url)
    try:
        alertstore.add_silence(
            db,
            matchers=[parse_matcher("node=node-c").to_json()],
            starts_at=T0 - 60,
            ends_at=T0 + 3600,
            comment="repairs",
            created_by="test",
            now=T0 - 60,
        )
        service = AlertService(db, config, notifiers={}, clock=ScaledClock(T0))  # the silence is active
        temperatures = {"node-a": 90.0, "node-b": 40.0, "node-c": 95.0}
        for k in range(2):
            now = T0 + 10 * k
            snaps = [snapshot(n, [healthy_gpu(n, 0, temperature_celsius=t)]) for n, t in temperatures.items()]
            service.process(
                now, snaps, [TargetHealth(n, f"http://{n}", "gpulens", now, True, node=n) for n in temperatures]
            )
    finally:
        db.close()
    return url


def test_alerts_list_prints_what_fires_and_what_is_pending(store: str) -> None:
    result = gpulens("alerts", "list", "--db", store)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "ALERTNAME",
        "STATE",
        "SEVERITY",
        "NODE",
        "GPU",
        "JOB_ID",
        "SINCE",
        "VALUE",
        "LABELS",
        "SUMMARY",
    ]
    rows = [line.split() for line in lines[1:]]
    # firing first, the most severe first; the pending alert last
    assert [(r[0], r[1]) for r in rows][:1] == [("GpuHot", "firing")]
    names = [(r[0], r[1], r[3] if r[0] != "Watchdog" else "-") for r in rows]
    assert ("GpuHot", "firing", "node-a") in names
    assert rows[-1][:2] == ["GpuWarm", "pending"]
    silenced = next(line for line in lines if "node-c" in line)
    assert "firing (silenced)" in silenced
    assert "2026-01-01T00:00:00Z" in lines[1]  # since when it fired
    assert any(r[0] == "Watchdog" and r[2] == "none" for r in rows)


def test_alerts_list_json_is_a_list_of_alert_objects(store: str) -> None:
    result = gpulens("alerts", "list", "--db", store, "--json")
    assert result.returncode == 0, result.stderr
    alerts = json.loads(result.stdout)
    hot = next(a for a in alerts if a["alertname"] == "GpuHot" and a["labels"]["node"] == "node-a")
    assert hot["state"] == "firing"
    assert hot["severity"] == "critical"
    assert hot["labels"]["uuid"] == uuid("node-a", 0)
    assert hot["since"] == "2026-01-01T00:00:00Z"
    assert hot["value"] == 90.0
    assert hot["summary"]
    assert hot["muted"] is None
    warm = next(a for a in alerts if a["alertname"] == "GpuWarm")
    assert (warm["state"], warm["labels"]["node"], warm["since"]) == ("pending", "node-b", "2026-01-01T00:00:00Z")
    assert {a["alertname"] for a in alerts} == {"GpuHot", "GpuWarm", "Watchdog"}
    assert next(a for a in alerts if a["labels"].get("node") == "node-c")["muted"] == "silenced"


def test_incidents_list_names_each_culprit_and_reads_the_state_store_beside_prometheus(store: str) -> None:
    table = gpulens("incidents", "list", "--db", store)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["ID", "STATE", "SEVERITY", "CULPRIT", "JOBS", "USERS", "ACTION", "AGE", "ALERTS"]
    assert any("GPU node-a:0" in line and "GpuHot" in line for line in lines[1:])
    assert not any("Watchdog" in line for line in lines)  # the heartbeat is no incident
    listed = gpulens("incidents", "list", "--db", store, "--json")
    assert listed.returncode == 0, listed.stderr
    incidents = json.loads(listed.stdout)
    hot = next(i for i in incidents if i["culprit"]["node"] == "node-a")
    assert hot["culprit"]["kind"] == "gpu"
    assert hot["culprit"]["uuid"] == uuid("node-a", 0)
    assert hot["state"] == "open"
    assert [m["rule"] for m in hot["members"]] == ["GpuHot"]
    # over Prometheus the engine keeps its incidents in the state store (--state-db): the same list
    beside = gpulens("incidents", "list", "--db", "prometheus+http://127.0.0.1:9", "--state-db", store, "--json")
    assert beside.returncode == 0, beside.stderr
    assert json.loads(beside.stdout) == incidents
