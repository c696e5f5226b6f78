"""The shipped Prometheus configs and Grafana dashboard: valid, in agreement with the metrics reference, and working.

The last test runs the compose stack's simulated exporter as its service definition says, scrapes it with a real
Prometheus using the shipped sim config, and evaluates every dashboard query against it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpulens.exporter.sim import SimCluster, load_scenario
from tests.conftest import free_port, http_get
from tests.deploy.support import (
    GRAFANA_JSON,
    METRICS_MD,
    PROFILES,
    PROMETHEUS_DIR,
    default_port,
    gpulens_command,
    image_path_in_repo,
    resolved_compose,
    service_env,
)

CONFIGS = ("prometheus.yml", "prometheus-sim.yml")
BASE_LABELS = {"node", "gpu", "uuid", "model"}
TARGET_LABELS = {"job", "instance"}  # added by Prometheus at scrape time
METRIC = re.compile(r"\b(gpulens_[a-z0-9_]+|DCGM_FI_[A-Z0-9_]+)\b")
SELECTOR = re.compile(r"\b(gpulens_[a-z0-9_]+|DCGM_FI_[A-Z0-9_]+)\{([^}]*)\}")
MATCHER = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")
# Grafana's variables, as the dashboard's "All" selection and a default rate window expand them.
VARIABLES = {"$node": ".*", "$job_id": ".*", "$__rate_interval": "1m"}


def promtool_check(promtool: str, config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=120, check=False
    )


def reference_labels() -> dict[str, set[str]]:
    """``{family: labels}`` from docs/metrics.md (generated from the code that renders /metrics)."""
    families: dict[str, set[str]] = {}
    for line in METRICS_MD.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`") and cells[0] != "`family`":
            extra = set() if cells[2] == "-" else {label.strip() for label in cells[2].split(",")}
            families[cells[0].strip("`")] = extra | BASE_LABELS | TARGET_LABELS
    return families


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(GRAFANA_JSON.read_text())
    return doc


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def expand(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


# --- Prometheus -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CONFIGS)
def test_promtool_accepts_the_config_and_every_rules_file(promtool: str, name: str) -> None:
    result = promtool_check(promtool, PROMETHEUS_DIR / name)
    assert result.returncode == 0, result.stdout + result.stderr
    rules = sorted((PROMETHEUS_DIR / "rules").glob("*.yml"))
    found = re.search(r"SUCCESS: (\d+) rule files found", result.stdout)
    assert (int(found.group(1)) if found else 0) == len(rules)
    for rule_file in rules:
        assert f"Checking {rule_file}" in result.stdout


def test_configs_load_the_rules_directory(promtool: str, tmp_path: Path) -> None:
    """A broken file in rules/ fails the check: the configs really load what is put there."""
    for name in CONFIGS:
        shutil.copy(PROMETHEUS_DIR / name, tmp_path / name)
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "broken.yml").write_text(
        "groups:\n  - name: x\n    rules:\n      - alert: X\n        expr: up ==\n"
    )
    for name in CONFIGS:
        result = promtool_check(promtool, tmp_path / name)
        assert result.returncode == 1, name
        assert "broken.yml" in result.stdout + result.stderr


def scrape_targets(config: dict[str, Any]) -> dict[str, list[tuple[str, str]]]:
    """``{job: [(address, metrics path)]}`` of a config's static targets."""
    jobs: dict[str, list[tuple[str, str]]] = {}
    for job in config["scrape_configs"]:
        for group in job.get("static_configs", []):
            path = group.get("labels", {}).get("__metrics_path__", job.get("metrics_path", "/metrics"))
            jobs.setdefault(job["job_name"], []).extend((target, path) for target in group["targets"])
    return jobs


def test_scrape_targets_are_compose_services_on_the_code_default_ports() -> None:
    services = resolved_compose(*PROFILES)["services"]
    gpu = scrape_targets(yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text()))
    sim = scrape_targets(yaml.safe_load((PROMETHEUS_DIR / "prometheus-sim.yml").read_text()))
    exporter_port = default_port("exporter")
    assert gpu["gpulens"] == [(f"exporter:{exporter_port}", "/metrics")]
    assert gpu["gpulens-collector"] == [("collector:9411", "/metrics")]
    assert sim["gpulens-collector"] == [("collector-sim:9411", "/metrics")]
    scenario = service_env(services["exporter-sim"])["GPULENS_EXPORTER_SCENARIO"]
    nodes = SimCluster(load_scenario(image_path_in_repo(scenario))).node_names()
    assert sim["gpulens"] == [(f"exporter-sim:{exporter_port}", f"/node/{node}/metrics") for node in nodes]
    for jobs in (gpu, sim):
        for targets in jobs.values():
            for address, _ in targets:
                assert address.partition(":")[0] in services, address


# --- Grafana ----------------------------------------------------------------------------------------------------------


def test_dashboard_is_well_formed() -> None:
    doc = dashboard()
    assert doc["uid"] == "gpulens-cluster"
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    cells: set[tuple[int, int]] = set()
    for panel in doc["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        area = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not cells & area, f"{panel['title']} overlaps another panel"
        cells |= area
    for panel in panels():
        assert panel["targets"], panel["title"]
        for target in [panel, *panel["targets"]]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]


def test_dashboard_queries_use_only_documented_metrics_and_labels() -> None:
    families = reference_labels()
    assert "gpulens_gpu_utilization_ratio" in families
    used: set[str] = set()
    for panel in panels():
        for target in panel["targets"]:
            expr = target["expr"]
            names = set(METRIC.findall(expr))
            used |= names
            assert names <= families.keys(), f"{panel['title']}: {names - families.keys()}"
            for family, matchers in SELECTOR.findall(expr):
                labels = set(MATCHER.findall(matchers))
                assert labels <= families[family], f"{panel['title']}: {family} has no {labels - families[family]}"
            allowed = set().union(*(families[name] for name in names)) if names else TARGET_LABELS
            referenced = {label.strip() for group in GROUPING.findall(expr) for label in group.split(",")} - {""}
            referenced |= set(LEGEND.findall(target.get("legendFormat", "")))
            assert referenced <= allowed, f"{panel['title']}: {referenced - allowed}"
    # the panels the dashboard promises: utilization, memory, temperature vs slowdown, power vs limit, throttling,
    # PCIe and NVLink throughput, errors, jobs
    for family in (
        "gpulens_gpu_utilization_ratio",
        "gpulens_gpu_memory_used_bytes",
        "gpulens_gpu_memory_total_bytes",
        "gpulens_gpu_temperature_celsius",
        "gpulens_gpu_slowdown_temperature_celsius",
        "gpulens_gpu_power_watts",
        "gpulens_gpu_power_limit_watts",
        "gpulens_gpu_throttle_active",
        "gpulens_gpu_pcie_throughput_bytes_per_second",
        "gpulens_gpu_nvlink_throughput_bytes_per_second",
        "gpulens_gpu_xid_errors_total",
        "gpulens_gpu_ecc_errors_total",
        "gpulens_gpu_nvlink_errors_total",
        "gpulens_gpu_job_info",
        "gpulens_process_gpu_memory_bytes",
    ):
        assert family in used, family


# --- the sim stack, live ----------------------------------------------------------------------------------------------


@contextmanager
def sim_exporter(tmp_path: Path) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """The compose file's exporter-sim service, run here: its command and environment, on a free local port."""
    service = resolved_compose("sim")["services"]["exporter-sim"]
    env = service_env(service)
    port = free_port()
    env["GPULENS_EXPORTER_LISTEN"] = f"127.0.0.1:{port}"
    env["GPULENS_EXPORTER_SCENARIO"] = str(image_path_in_repo(env["GPULENS_EXPORTER_SCENARIO"]))
    with (tmp_path / "exporter.log").open("wb") as log:
        proc = subprocess.Popen([*gpulens_command(), *service["command"]], env=env, stdout=log, stderr=log)
        try:
            wait_until(lambda: http_get(f"http://127.0.0.1:{port}/healthz", timeout=2)[0] == 200, [proc], tmp_path)
            yield port, proc
        finally:
            proc.terminate()
            proc.wait(timeout=30)


@contextmanager
def prometheus_with(
    prometheus_bin: str, config: dict[str, Any], tmp_path: Path
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [
        prometheus_bin,
        f"--config.file={path}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with (tmp_path / "prometheus.log").open("wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=log)
        try:
            wait_until(lambda: http_get(f"{base}/-/ready", timeout=2)[0] == 200, [proc], tmp_path)
            yield base, proc
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def wait_until(
    ready: Callable[[], bool], procs: list[subprocess.Popen[bytes]], tmp_path: Path, timeout: float = 90
) -> None:
    """Poll ``ready`` until it holds; fail with the logs if a process exits or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if ready():
                return
        except OSError:
            pass
        logs = "".join(p.read_text(errors="replace")[-2000:] for p in tmp_path.glob("*.log"))
        assert all(proc.poll() is None for proc in procs), f"exited early:\n{logs}"
        assert time.monotonic() < deadline, f"not ready in {timeout}s:\n{logs}"
        time.sleep(0.2)


def instant(base: str, expr: str) -> dict[str, Any]:
    status, _, body = http_get(f"{base}/api/v1/query?query={urllib.parse.quote(expr)}", timeout=30)
    doc: dict[str, Any] = json.loads(body)
    doc["http_status"] = status
    return doc


# Panels that the demo scenario fills from its first minutes: a running training job, inference, an idle allocation.
EXPECT_DATA = {
    "GPUs up",
    "Mean utilization",
    "Memory used",
    "Power drawn",
    "Jobs running",
    "GPU utilization",
    "Memory used / total",
    "GPU temperature vs slowdown threshold",
    "Headroom to slowdown",
    "Power / enforced limit",
    "SM clock / maximum",
    "PCIe throughput",
    "NVLink throughput",
    "Jobs",
    "Utilization by job",
    "NVLink traffic by job",
    "Collection duration",
    "Exporter versions",
}


def test_sim_stack_is_scraped_and_every_dashboard_query_evaluates(prometheus_bin: str, tmp_path: Path) -> None:
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus-sim.yml").read_text())
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "gpulens"]
    nodes = len(job["static_configs"])
    with sim_exporter(tmp_path) as (port, exporter):
        # the shipped gpulens job, pointed at the local exporter and scraped every second
        for group in job["static_configs"]:
            group["targets"] = [f"127.0.0.1:{port}"]
        config = {"global": {"scrape_interval": "1s", "scrape_timeout": "900ms"}, "scrape_configs": [job]}
        with prometheus_with(prometheus_bin, config, tmp_path) as (prom, prometheus):

            def scraped_thrice() -> bool:
                """Every node up, with enough samples for rate() and increase()."""
                expr = 'count_over_time(up{job="gpulens"}[1m]) >= 3 and up{job="gpulens"} == 1'
                return len(instant(prom, expr)["data"]["result"]) == nodes

            wait_until(scraped_thrice, [exporter, prometheus], tmp_path)
            up = instant(prom, 'up{job="gpulens"}')["data"]["result"]
            instances = sorted(r["metric"]["instance"] for r in up)
            assert instances == [f"127.0.0.1:{port}/node-{i:02d}" for i in range(nodes)]
            empty = set()
            for panel in panels():
                for target in panel["targets"]:
                    answer = instant(prom, expand(target["expr"]))
                    assert answer["http_status"] == 200, f"{panel['title']}: {answer}"
                    assert answer["status"] == "success", f"{panel['title']}: {answer}"
                    if not answer["data"]["result"]:
                        empty.add(panel["title"])
            assert not EXPECT_DATA & empty, sorted(EXPECT_DATA & empty)
            by_job = next(p for p in panels() if p["title"] == "Utilization by job")["targets"][0]["expr"]
            jobs = {r["metric"]["job_id"] for r in instant(prom, expand(by_job))["data"]["result"]}
            assert jobs >= {"llm-pretrain", "chat-api", "reserved-eval"}
