"""The shipped Prometheus configs and Grafana dashboard: valid, in agreement with the metrics reference, and working.

The live tests run the compose stack's simulated exporter as its service definition says, scrape it with a real
Prometheus using the shipped sim config (one Prometheus for the module), and evaluate every dashboard query against
it with its template variables resolved as Grafana resolves them: each must parse and return data.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpulens.exporter.sim import SimCluster, load_scenario
from gpulens.storage.prometheus import recording
from tests.conftest import free_port, http_get
from tests.deploy.grafanavars import View, range_of, rate_interval_s, resolve
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
# a recorded series of the shipped recording rules (level:metric:operations), and the labels each level keeps
RECORDED = re.compile(r"\b((node|job|port|cluster):gpulens_[a-z0-9_]+:[a-z0-9_]+)(?:\{([^}]*)\})?")
RECORDED_LABELS = {"node": {"node"}, "job": {"job_id", "user"}, "port": {"node", "device", "port"}, "cluster": set()}
LABEL_VALUES = re.compile(r"label_values\((\w+),\s*(\w+)\)")
SCRAPE_S = 1  # the test Prometheus's scrape interval, and so the data source's "scrape interval" setting
SELECTED = {"node": ["node-00", "node-01"], "job_id": ["llm-pretrain"]}  # a selection of values, not "All"


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
    recorded: set[str] = set()
    for panel in panels():
        for target in panel["targets"]:
            recorded_labels: set[str] = set()
            for name, level, matchers in RECORDED.findall(target["expr"]):
                assert name in recording.names(), f"{panel['title']}: {name} is not a recorded series of ours"
                labels = set(MATCHER.findall(matchers))
                assert labels <= RECORDED_LABELS[level], f"{panel['title']}: {name} has no {labels}"
                recorded_labels |= RECORDED_LABELS[level]
                recorded.add(name)
            expr = RECORDED.sub("", target["expr"])
            names = set(METRIC.findall(expr))
            used |= names
            assert names <= families.keys(), f"{panel['title']}: {names - families.keys()}"
            for family, matchers in SELECTOR.findall(expr):
                labels = set(MATCHER.findall(matchers))
                assert labels <= families[family], f"{panel['title']}: {family} has no {labels - families[family]}"
            allowed = set().union(*(families[name] for name in names)) if names else TARGET_LABELS
            allowed |= recorded_labels
            referenced = {label.strip() for group in GROUPING.findall(expr) for label in group.split(",")} - {""}
            referenced |= set(LEGEND.findall(target.get("legendFormat", "")))
            assert referenced <= allowed, f"{panel['title']}: {referenced - allowed}"
    # the panels the dashboard promises: utilization, memory, temperature vs slowdown, power vs limit, throttling,
    # PCIe and NVLink throughput, errors, jobs, the RDMA fabric, hosts, job cgroups, Slurm metadata, NCCL
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
        "gpulens_nic_up",
        "gpulens_nic_receive_bytes_total",
        "gpulens_nic_transmit_bytes_total",
        "gpulens_nic_link_speed_bytes_per_second",
        "gpulens_nic_transmit_wait_total",
        "gpulens_nic_symbol_errors_total",
        "gpulens_host_cpu_busy_ratio",
        "gpulens_host_memory_used_bytes",
        "gpulens_job_cpu_seconds_total",
        "gpulens_job_memory_used_bytes",
        "gpulens_job_info",
        "gpulens_nccl_rank_lag",
        "gpulens_nccl_collective_launched_total",
    ):
        assert family in used, family
    # at 10,000 nodes the cluster's stats and the per-job panels read the recording rules' few series
    assert {recording.NODE_UP, recording.NODE_POWER, recording.JOB_GPUS, recording.NODE_MEMORY_USED} <= recorded


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


def targets() -> list[tuple[str, str]]:
    """``(panel title, expression)`` of every query the dashboard sends."""
    return [(panel["title"], target["expr"]) for panel in panels() for target in panel["targets"]]


@dataclass(frozen=True)
class SimPrometheus:
    base: str  # Prometheus's URL
    exporter_port: int
    nodes: int


@pytest.fixture(scope="module")
def sim_prometheus(prometheus_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimPrometheus]:
    """The compose stack's simulated exporter (the demo cluster: GPUs, RDMA ports, hosts, job cgroups, NCCL RAS)
    scraped every second by a real Prometheus with the shipped sim config's gpulens job; every node scraped at least
    three times, so that rate() and increase() have samples."""
    tmp_path = tmp_path_factory.mktemp("sim-stack")
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus-sim.yml").read_text())
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "gpulens"]
    nodes = len(job["static_configs"])
    with sim_exporter(tmp_path) as (port, exporter):
        # the shipped gpulens job, pointed at the local exporter and scraped every second
        for group in job["static_configs"]:
            group["targets"] = [f"127.0.0.1:{port}"]
        # the shipped recording rules, evaluated every second (the shipped file: every 180 s)
        rules = tmp_path / recording.RULE_FILE
        rules.write_text(recording.rules_yaml(SCRAPE_S, SCRAPE_S))
        config = {
            "global": {"scrape_interval": f"{SCRAPE_S}s", "scrape_timeout": "900ms"},
            "scrape_configs": [job],
            "rule_files": [str(rules)],
        }
        with prometheus_with(prometheus_bin, config, tmp_path) as (prom, prometheus):

            def scraped_thrice() -> bool:
                """Every node up, with enough samples for rate() and increase()."""
                expr = 'count_over_time(up{job="gpulens"}[1m]) >= 3 and up{job="gpulens"} == 1'
                recorded = instant(prom, f"count_over_time({recording.NODE_UP}[1m]) >= 2")["data"]["result"]
                return len(instant(prom, expr)["data"]["result"]) == nodes and len(recorded) == nodes

            wait_until(scraped_thrice, [exporter, prometheus], tmp_path)
            yield SimPrometheus(prom, port, nodes)


def test_sim_stack_is_scraped_as_the_shipped_config_says(sim_prometheus: SimPrometheus) -> None:
    up = instant(sim_prometheus.base, 'up{job="gpulens"}')["data"]["result"]
    instances = sorted(r["metric"]["instance"] for r in up)
    port = sim_prometheus.exporter_port
    assert instances == [f"127.0.0.1:{port}/node-{i:02d}" for i in range(sim_prometheus.nodes)]


def test_template_variables_list_the_simulated_nodes_and_jobs(sim_prometheus: SimPrometheus) -> None:
    """Each query variable's ``label_values(metric, label)``, asked as Grafana asks it (the label values API)."""
    found = {}
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        call = LABEL_VALUES.fullmatch(variable["definition"])
        assert call, variable["definition"]
        assert variable["query"]["query"] == variable["definition"]
        metric, label = call.groups()
        query = urllib.parse.urlencode({"match[]": metric})
        status, _, body = http_get(f"{sim_prometheus.base}/api/v1/label/{label}/values?{query}", timeout=30)
        assert status == 200, body
        found[variable["name"]] = set(json.loads(body)["data"])
    assert found["node"] == {f"node-{i:02d}" for i in range(sim_prometheus.nodes)}
    assert found["job_id"] >= {"llm-pretrain", "chat-api", "reserved-eval"}
    for name, values in SELECTED.items():
        assert set(values) <= found[name]


@pytest.mark.parametrize("chosen", [{}, SELECTED], ids=["all", "chosen"])
def test_every_dashboard_query_parses_and_returns_data(
    sim_prometheus: SimPrometheus, chosen: dict[str, list[str]]
) -> None:
    """Every panel's every query, its variables resolved as Grafana resolves them (tests/deploy/grafanavars.py) for
    "All" and for two chosen nodes and one job, evaluated by Prometheus at the latest sample (an instant query: a
    range panel's query is the same expression at each step)."""
    doc = dashboard()
    view = View(range_s=range_of(doc), scrape_interval_s=SCRAPE_S, chosen=chosen)
    assert rate_interval_s(view) == 21  # 6 h over 1,000 points: $__interval 20s, + one scrape interval
    failures = []
    for title, expr in targets():
        query = resolve(expr, doc, view)
        assert "$" not in query, f"{title}: unresolved variable in {query}"
        answer = instant(sim_prometheus.base, query)
        if answer["http_status"] != 200 or answer["status"] != "success":
            failures.append(f"{title}: {query}: {answer.get('error')}")
        elif not answer["data"]["result"]:
            failures.append(f"{title}: {query}: no data")
    assert not failures, "\n".join(failures)


def test_job_panels_name_the_scenario_jobs(sim_prometheus: SimPrometheus) -> None:
    doc = dashboard()
    view = View(range_s=range_of(doc), scrape_interval_s=SCRAPE_S)
    by_job = next(p for p in panels() if p["title"] == "Median GPU utilization by job")["targets"][0]["expr"]
    jobs = {r["metric"]["job_id"] for r in instant(sim_prometheus.base, resolve(by_job, doc, view))["data"]["result"]}
    assert jobs >= {"llm-pretrain", "chat-api", "reserved-eval"}
    lag = next(p for p in panels() if p["title"] == "Rank lag (operations behind)")["targets"][0]["expr"]
    ranked = {r["metric"]["job_id"] for r in instant(sim_prometheus.base, resolve(lag, doc, view))["data"]["result"]}
    assert "llm-pretrain" in ranked


def test_chosen_nodes_narrow_the_panels(sim_prometheus: SimPrometheus) -> None:
    doc = dashboard()
    view = View(range_s=range_of(doc), scrape_interval_s=SCRAPE_S, chosen=SELECTED)
    for title in ("CPU busy", "Port receive rate", "GPU utilization"):
        expr = next(p for p in panels() if p["title"] == title)["targets"][0]["expr"]
        result = instant(sim_prometheus.base, resolve(expr, doc, view))["data"]["result"]
        assert {r["metric"]["node"] for r in result} == set(SELECTED["node"]), title
