"""NVIDIA's dcgm-exporter Grafana dashboard (12239) works on ``gpulens exporter --source sim --dcgm-compat``.

A real Prometheus scrapes the real command; every panel's PromQL (tests/fixtures/dcgm/grafana_12239_panels.json,
the current revision's 8 panels and the older revision's extra ones) must return data through /api/v1/query.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import free_port, http_get
from tests.prom import query, running_prometheus, wait_for

ROOT = Path(__file__).resolve().parents[2]
PANELS = json.loads((ROOT / "tests" / "fixtures" / "dcgm" / "grafana_12239_panels.json").read_text())


def _expr(template: str) -> str:
    """The panel's query with its variables set to "All" (Grafana sends a match-everything regex)."""
    for variable in ("${instance}", "${gpu}", "$instance", "$gpu"):
        template = template.replace(variable, ".+")
    return template


def test_every_dashboard_panel_returns_data(prometheus_bin: str, tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")}
    env["PYTHONPATH"] = str(ROOT)
    command = [
        sys.executable,
        "-m",
        "gpulens.cli",
        "exporter",
        "--source",
        "sim",
        "--scenario",
        str(ROOT / "examples" / "scenarios" / "healthy.toml"),
        "--node",
        "node-00",
        "--dcgm-compat",
        "--listen",
        f"127.0.0.1:{port}",
    ]
    log = (tmp_path / "exporter.log").open("wb")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if http_get(f"http://127.0.0.1:{port}/metrics", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None, (tmp_path / "exporter.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "exporter.log").read_text()
            time.sleep(0.3)
        with running_prometheus(prometheus_bin, tmp_path, {"gpulens": (f"127.0.0.1:{port}", "/metrics")}) as prom:
            wait_for(prom, "DCGM_FI_DEV_GPU_TEMP", lambda r: len(r) == 8)
            values = wait_for(prom, "group by (instance, gpu) (DCGM_FI_DEV_GPU_TEMP)", lambda r: len(r) == 8)
            assert {r["metric"]["instance"] for r in values} == {f"127.0.0.1:{port}"}
            assert len(PANELS["current"]) == 8
            for title, template in PANELS["current"] + PANELS["older"]:
                result = query(prom, _expr(template))
                assert result, f"panel {title!r}: {_expr(template)} returned nothing"
                assert all(float(r["value"][1]) == float(r["value"][1]) for r in result), title  # no NaN
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()
