"""The Prometheus export of the builtin rules: promtool accepts it, and the shipped file is current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from gpulens.alerts.catalogue import BUILTIN_NAMES
from gpulens.alerts.promexport import NOT_EXPORTED, prometheus_rules_yaml
from gpulens.alerts.rules import builtin_rules

SHIPPED = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "rules" / "gpulens.yml"


def test_promtool_checks_the_exported_rules(promtool: str, tmp_path: Path) -> None:
    path = tmp_path / "rules.yml"
    path.write_text(prometheus_rules_yaml(builtin_rules()))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    # CommunicationStall is exported once per signature; JobInputBound and JobInefficient are not exportable
    assert NOT_EXPORTED.keys() == {"JobInputBound", "JobInefficient"}
    assert f"SUCCESS: {len(BUILTIN_NAMES) - len(NOT_EXPORTED) + 2} rules found" in result.stdout


def test_every_builtin_is_exported_with_its_severity_and_for() -> None:
    doc = yaml.safe_load(prometheus_rules_yaml(builtin_rules()))
    rules = doc["groups"][0]["rules"]
    exported = {r["alert"]: r for r in rules}
    assert set(exported) == set(BUILTIN_NAMES) - set(NOT_EXPORTED)
    stalls = {r["labels"]["signature"]: r for r in rules if r["alert"] == "CommunicationStall"}
    assert set(stalls) == {"spinning", "blocked", "mixed"}
    assert {r["labels"]["severity"] for r in stalls.values()} == {"critical"}
    assert stalls["spinning"]["for"] == "5m"
    assert stalls["blocked"]["for"] == stalls["mixed"]["for"] == "16m"  # blocked_after_s (11m) + for
    assert all("gpulens_gpu_job_info" in r["expr"] for r in stalls.values())
    assert "gpulens_gpu_memory_used_bytes" in stalls["blocked"]["expr"]


def test_overrides_reach_the_export() -> None:
    doc = yaml.safe_load(
        prometheus_rules_yaml(builtin_rules({"GpuMemorySaturated": {"used_ratio": 0.9, "for": "10m"}}))
    )
    rule = next(r for r in doc["groups"][0]["rules"] if r["alert"] == "GpuMemorySaturated")
    assert rule["expr"].endswith(">= 0.9")
    assert rule["for"] == "10m"


def test_the_shipped_rules_file_is_current() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpulens.cli", "rules", "export", "--format", "prometheus"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert SHIPPED.read_text() == result.stdout, "regenerate deploy/prometheus/rules/gpulens.yml"


def test_fabric_rules_are_exported_over_the_nic_families() -> None:
    doc = yaml.safe_load(prometheus_rules_yaml(builtin_rules({"IbLinkFlapping": {"flaps_max": 4, "window_s": "30m"}})))
    exported = {r["alert"]: r for r in doc["groups"][0]["rules"]}
    assert exported["IbLinkFlapping"]["expr"] == "increase(gpulens_nic_link_downed_total[30m]) > 4"
    assert "gpulens_nic_info" in exported["IbLinkDown"]["expr"]  # the port's GPUs join in as `gpus`
    assert exported["IbLinkDown"]["for"] == "1m"
    assert exported["FabricBandwidthSaturated"]["labels"]["severity"] == "warning"
    for name in ("IbLinkDown", "IbLinkDegraded", "IbErrors", "FabricCongestion", "FabricBandwidthSaturated"):
        assert "gpulens_nic_" in exported[name]["expr"], name
        assert "$labels.device" in exported[name]["annotations"]["summary"], name
