"""The Prometheus export of the builtin rules: promtool accepts it, and the shipped file is current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from gpulens.alerts.catalogue import BUILTIN_NAMES, GPULENS_ONLY
from gpulens.alerts.promexport import prometheus_rules_yaml
from gpulens.alerts.rules import builtin_rules
from gpulens.alerts.selfhealth import SELF_RULES

SHIPPED = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "rules" / "gpulens.yml"


def test_promtool_checks_the_exported_rules(promtool: str, tmp_path: Path) -> None:
    path = tmp_path / "rules.yml"
    path.write_text(prometheus_rules_yaml(builtin_rules()))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    # CommunicationStall is exported once per signature (five: three from utilisation, two from NCCL RAS),
    # GpuConfigDrift once per setting (four); JobInputBound and JobInefficient are not exportable
    assert GPULENS_ONLY.keys() == {"JobInputBound", "JobInefficient"}
    assert f"SUCCESS: {len(BUILTIN_NAMES) - len(GPULENS_ONLY) + 4 + 3 + len(SELF_RULES)} rules found" in result.stdout


def test_every_builtin_is_exported_with_its_severity_and_for() -> None:
    doc = yaml.safe_load(prometheus_rules_yaml(builtin_rules()))
    rules = doc["groups"][0]["rules"]
    exported = {r["alert"]: r for r in rules}
    assert set(exported) == set(BUILTIN_NAMES) - set(GPULENS_ONLY)
    stalls = {r["labels"]["signature"]: r for r in rules if r["alert"] == "CommunicationStall"}
    assert set(stalls) == {"spinning", "blocked", "mixed", "rank_dead", "rank_missing"}
    assert {r["labels"]["severity"] for r in stalls.values()} == {"critical"}
    assert stalls["spinning"]["for"] == "5m"
    assert stalls["blocked"]["for"] == stalls["mixed"]["for"] == "16m"  # blocked_after_s (11m) + for
    assert all("gpulens_gpu_job_info" in r["expr"] for r in stalls.values())
    assert "for" not in stalls["rank_dead"]  # as the engine raises the NCCL signatures: at once
    assert "for" not in stalls["rank_missing"]
    assert "gpulens_nccl_rank_dead" in stalls["rank_dead"]["expr"]
    assert "gpulens_gpu_memory_used_bytes" in stalls["blocked"]["expr"]


def test_overrides_reach_the_export() -> None:
    doc = yaml.safe_load(
        prometheus_rules_yaml(builtin_rules({"GpuMemorySaturated": {"used_ratio": 0.9, "for": "10m"}}))
    )
    rule = next(r for r in doc["groups"][0]["rules"] if r["alert"] == "GpuMemorySaturated")
    assert "(0.9 * gpulens_gpu_memory_total_bytes)" in rule["expr"]
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


def _series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    pairs = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{pairs}}}", "values": values}


def test_exported_alerts_render_complete_sentences_under_promtool(promtool: str, tmp_path: Path) -> None:
    """``promtool test rules``: input series for a stalled two-GPU job, a full GPU memory, a port gone down, an
    exporter that does not answer and one whose driver hangs; the alerts and their exact annotations as Prometheus
    renders them."""
    rules = {r.name: r for r in builtin_rules()}
    (tmp_path / "rules.yml").write_text(prometheus_rules_yaml(list(rules.values())))
    gpus = [{"node": "node-01", "gpu": str(i), "uuid": f"GPU-{i}", "model": "H100"} for i in range(2)]
    series = []
    for g in gpus:
        place = {k: g[k] for k in ("node", "gpu", "uuid")}
        series += [
            _series("gpulens_gpu_job_info", {**place, "job_id": "llm-pretrain", "user": "alice"}, "1x50"),
            _series("gpulens_gpu_utilization_ratio", g, "1x50"),
            _series("gpulens_gpu_nvlink_throughput_bytes_per_second", {**g, "direction": "tx"}, "2e9x10 0x40"),
            _series("gpulens_gpu_pcie_throughput_bytes_per_second", {**g, "direction": "tx"}, "0x50"),
            _series("gpulens_gpu_memory_used_bytes", g, "80e9x50"),
            _series("gpulens_gpu_memory_total_bytes", g, "81e9x50"),
        ]
    port = {"node": "node-01", "device": "mlx5_0", "port": "1"}
    series += [
        _series("gpulens_nic_up", port, "1x10 0x40"),
        _series(
            "gpulens_nic_info",
            {**port, "link_layer": "InfiniBand", "gpus": "0,1", "pci_bus_id": "0000:17:00.0"},
            "1x50",
        ),
        _series("up", {"job": "gpulens-exporters", "instance": "node-02:9410"}, "0x50"),
        # node-03 of the same job answers with gpulens families: the job is watched; a node exporter is not
        _series("up", {"job": "gpulens-exporters", "instance": "node-03:9410"}, "1x50"),
        _series("gpulens_exporter_build_info", {"job": "gpulens-exporters", "instance": "node-03:9410"}, "1x50"),
        _series("up", {"job": "node", "instance": "node-02:9100"}, "0x50"),
        # node-03's driver hangs while its exporter answers: GpuDriverHung, and no ExporterDown for it
        _series(
            "gpulens_node_nvml_hung",
            {"job": "gpulens-exporters", "instance": "node-03:9410", "node": "node-03"},
            "0x10 1x40",
        ),
        _series(
            "gpulens_node_nvml_hung",
            {"job": "gpulens-exporters", "instance": "node-01:9410", "node": "node-01"},
            "0x50",
        ),
    ]

    def annotations(rule: str, summary: str) -> dict[str, str]:
        doc = yaml.safe_load(prometheus_rules_yaml([rules[rule]]))["groups"][0]["rules"][0]
        return {"summary": summary, "description": doc["annotations"]["description"], "runbook": rules[rule].action}

    stall = annotations(
        "CommunicationStall",
        "CommunicationStall (spinning): job llm-pretrain of user alice: its 2 GPUs spin at full utilization with no "
        "NVLink or PCIe traffic.",
    )
    expected = [
        {
            "alertname": "CommunicationStall",
            "exp_alerts": [
                {
                    "exp_labels": {
                        "severity": "critical",
                        "signature": "spinning",
                        "job_id": "llm-pretrain",
                        "user": "alice",
                    },
                    "exp_annotations": stall,
                }
            ],
        },
        {
            "alertname": "GpuMemorySaturated",
            "exp_alerts": [
                {
                    "exp_labels": {"severity": "warning", **g},
                    "exp_annotations": annotations(
                        "GpuMemorySaturated", f"GpuMemorySaturated on GPU node-01:{g['gpu']} ({g['uuid']})."
                    ),
                }
                for g in gpus
            ],
        },
        {
            "alertname": "IbLinkDown",
            "exp_alerts": [
                {
                    "exp_labels": {"severity": rules["IbLinkDown"].severity, **port, "gpus": "0,1"},
                    "exp_annotations": annotations("IbLinkDown", "IbLinkDown on node-01 port mlx5_0 1."),
                }
            ],
        },
        {
            "alertname": "ExporterDown",
            "exp_alerts": [
                {
                    "exp_labels": {"severity": "critical", "job": "gpulens-exporters", "instance": "node-02:9410"},
                    "exp_annotations": annotations(
                        "ExporterDown",
                        "ExporterDown: the exporter at node-02:9410 (job gpulens-exporters) does not answer.",
                    ),
                }
            ],
        },
        {
            "alertname": "GpuDriverHung",
            "exp_alerts": [
                {
                    "exp_labels": {"severity": "critical", "node": "node-03"},
                    "exp_annotations": annotations(
                        "GpuDriverHung",
                        "GpuDriverHung: the GPU driver of node-03 is hung (an NVML call does not return).",
                    ),
                }
            ],
        },
    ]
    test = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {"interval": "1m", "input_series": series, "alert_rule_test": [{"eval_time": "30m", **e} for e in expected]}
        ],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test, sort_keys=False, width=1000))
    result = subprocess.run(
        [promtool, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr
    assert "quiet_ratio" not in stall["description"]
    assert "below 5% of the job's own recent baseline" in stall["description"]


def test_no_exported_description_leaves_a_threshold_unfilled() -> None:
    all_rules = builtin_rules()
    doc = yaml.safe_load(prometheus_rules_yaml(all_rules))
    names = {k for r in all_rules for k in r.thresholds} | {"for"}
    for entry in doc["groups"][0]["rules"]:
        description = entry["annotations"]["description"]
        assert not [n for n in names if f"`{n}`" in description], entry["alert"]
        assert "{{" not in description
        assert entry["annotations"]["summary"].endswith(".")
        assert entry["annotations"]["runbook"]


def test_the_watchdog_is_prometheus_conventional_vector_1() -> None:
    doc = yaml.safe_load(prometheus_rules_yaml(builtin_rules()))
    [watchdog] = [r for r in doc["groups"][0]["rules"] if r["alert"] == "Watchdog"]
    assert watchdog["expr"] == "vector(1)"
    assert watchdog["labels"] == {"severity": "none"}
    assert "for" not in watchdog


def test_rules_list_prints_every_builtin_and_where_it_runs() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpulens.cli", "rules", "list"], capture_output=True, text=True, check=True
    )
    lines = {line.split()[0]: line for line in result.stdout.splitlines()[1:] if line.split()}
    for name in BUILTIN_NAMES:
        where = "engine only" if name in GPULENS_ONLY else "engine, Prometheus"
        assert where in lines[name], name
    for name, why in GPULENS_ONLY.items():
        assert f"{name} runs in the engine only: {why}." in result.stdout


def test_the_export_names_each_gpulens_only_rule_and_the_docs_give_its_reason() -> None:
    text = prometheus_rules_yaml(builtin_rules())
    docs = (Path(__file__).resolve().parents[2] / "docs" / "prometheus-alerts.md").read_text()
    for name, why in GPULENS_ONLY.items():
        assert f"# {name} is gpulens-only (not exported): {why}." in text
        assert f"| `{name}` | {why} |" in docs, name


def test_xid_error_names_the_xid_and_its_action_under_promtool(promtool: str, tmp_path: Path) -> None:
    """XidError's summary reads the XID's name and action from ``gpulens_gpu_xid_action_info`` where the exporter
    serves it, and stays a plain sentence where it does not (an older exporter, a dcgm-exporter page)."""
    rule = next(r for r in builtin_rules() if r.name == "XidError")
    (tmp_path / "rules.yml").write_text(prometheus_rules_yaml([rule]))
    g0 = {"node": "node-01", "gpu": "0", "uuid": "GPU-0", "model": "H100"}
    g1 = {**g0, "gpu": "1", "uuid": "GPU-1"}
    series = [
        _series("gpulens_gpu_xid_errors_total", {**g0, "xid": "79"}, "_x25 1x10"),
        _series(
            "gpulens_gpu_xid_action_info",
            {**g0, "xid": "79", "name": "GPU has fallen off the bus", "action": "reboot"},
            "_x25 1x10",
        ),
        _series("gpulens_gpu_xid_errors_total", {**g1, "xid": "48"}, "_x25 1x10"),
        # the GPUs answered before their first XID: the series that begins at 1 is a first event
        _series("gpulens_gpu_up", g0, "1x35"),
        _series("gpulens_gpu_up", g1, "1x35"),
    ]
    description = yaml.safe_load(prometheus_rules_yaml([rule]))["groups"][0]["rules"][0]["annotations"]["description"]

    def alert(g: dict[str, str], xid: str, summary: str) -> dict[str, object]:
        return {
            "exp_labels": {"severity": "critical", **g, "xid": xid},
            "exp_annotations": {"summary": summary, "description": description, "runbook": rule.action},
        }

    expected = [
        alert(
            g0,
            "79",
            "XidError on GPU node-01:0: the driver reported XID 79 (GPU has fallen off the bus; action: reboot).",
        ),
        alert(g1, "48", "XidError on GPU node-01:1: the driver reported XID 48."),
    ]
    test = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [{"eval_time": "30m", "alertname": "XidError", "exp_alerts": expected}],
            }
        ],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test, sort_keys=False, width=1000))
    result = subprocess.run(
        [promtool, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
