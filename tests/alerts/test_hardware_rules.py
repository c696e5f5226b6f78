"""The node's hardware rules: GpuMissing, IbPortMissing, IbPortSlow, GpuFabricNotReady and GpuConfigDrift fire from
their checks over a history of snapshots, and their PromQL fires the same under ``promtool test rules``."""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from gpulens.alerts import hardwarechecks
from gpulens.alerts.base import AlertRule, Candidate
from gpulens.alerts.history import History
from gpulens.alerts.promexport import prometheus_rules_yaml
from gpulens.alerts.rules import builtin_rules
from gpulens.fabricmodel import NicReading
from gpulens.model import GpuReading, NodeSnapshot
from gpulens.nodehardware import FABRIC_COMPLETED, FABRIC_IN_PROGRESS, GpuConfig, NodeHardware

NEW = ("GpuMissing", "IbPortMissing", "IbPortSlow", "GpuFabricNotReady", "GpuConfigDrift")
RULES = {r.name: r for r in builtin_rules() if r.name in NEW}
NDR = 5e10  # 400 Gb/s in bytes per second
H100 = "NVIDIA H100 80GB HBM3"


def _gpu(node: str, i: int) -> GpuReading:
    return GpuReading(node, i, f"GPU-{node}-{i}", "NVIDIA H100 80GB HBM3", 0.0, pci_bus_id=f"0000:{0x18 + i:02x}:00.0")


def _configs(node: str, gpus: int, **changes: Any) -> tuple[GpuConfig, ...]:
    base = {"persistence_mode": True, "ecc_enabled": True, "fabric_state": FABRIC_COMPLETED, "fabric_ready": True}
    return tuple(GpuConfig(i, f"GPU-{node}-{i}", **{**base, **changes.get(str(i), {})}) for i in range(gpus))


def _snapshot(
    node: str,
    hardware: NodeHardware,
    *,
    gpus: int = 2,
    nics: Sequence[NicReading] = (),
    driver: str = "550.127.08",
) -> NodeSnapshot:
    return NodeSnapshot(
        node,
        0.0,
        "nvml",
        gpus=tuple(_gpu(node, i) for i in range(gpus)),
        nics=tuple(nics),
        driver_version=driver,
        hardware=hardware,
    )


def _fire(name: str, snapshots: Sequence[NodeSnapshot], rule: AlertRule | None = None) -> list[Candidate]:
    history = History()
    history.add(1000.0, snapshots)
    check = getattr(hardwarechecks, {"GpuFabricNotReady": "gpu_fabric_not_ready"}.get(name, _snake(name)))
    return list(check(rule or RULES[name], history, 1000.0))


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")


def _port(node: str, device: str, *, up: bool = True, rate: float = NDR, layer: str = "InfiniBand") -> NicReading:
    return NicReading(node, device, 1, link_layer=layer, up=up, rate_bytes_per_second=rate, gpus=(0,))


def test_gpu_missing_names_the_address_nvml_never_opened() -> None:
    hw = NodeHardware(pci_gpus=("0000:18:00.0", "0000:19:00.0", "0000:1a:00.0"), missing_gpus=("0000:1a:00.0",))
    [alert] = _fire("GpuMissing", [_snapshot("n1", hw)])
    assert alert.labels["pci_bus_id"] == "0000:1a:00.0"
    assert alert.labels["node"] == "n1"
    assert alert.labels["severity"] == "critical"
    assert "0000:1a:00.0" in alert.summary


def test_gpu_missing_from_the_bus_itself_fires_against_the_expectation() -> None:
    short = NodeHardware(pci_gpus=("0000:18:00.0", "0000:19:00.0"), gpus_expected=3)
    [alert] = _fire("GpuMissing", [_snapshot("n1", short)])
    assert "2 of 3 expected" in alert.summary
    assert "pci_bus_id" not in alert.labels
    whole = NodeHardware(pci_gpus=("0000:18:00.0", "0000:19:00.0"), gpus_expected=2)
    assert _fire("GpuMissing", [_snapshot("n1", whole)]) == []
    unread_bus = NodeHardware(pci_gpus=None, nvml_gpus=1, gpus_expected=2)  # NVML's count stands in
    assert len(_fire("GpuMissing", [_snapshot("n1", unread_bus)])) == 1


def test_ib_ports_missing_and_slow_against_the_expectation() -> None:
    hw = NodeHardware(ib_ports_expected=3, ib_rate_expected_bytes_per_second=NDR)
    nics = [
        _port("n1", "mlx5_0"),
        _port("n1", "mlx5_1", rate=NDR / 2),  # up at 200 Gb/s: slow
        _port("n1", "mlx5_2", up=False),  # never came up: missing, not slow
        _port("n1", "mlx5_3", rate=NDR / 4, layer="Ethernet"),  # RoCE: neither
    ]
    [missing] = _fire("IbPortMissing", [_snapshot("n1", hw, nics=nics)])
    assert "2 of 3 expected" in missing.summary
    assert "mlx5_2/1" in missing.description
    [slow] = _fire("IbPortSlow", [_snapshot("n1", hw, nics=nics)])
    assert (slow.labels["device"], slow.labels["port"], slow.labels["severity"]) == ("mlx5_1", "1", "warning")
    assert "200 Gb/s, expected 400 Gb/s" in slow.summary
    within = [_port("n1", "mlx5_0", rate=NDR * 0.995)]
    assert _fire("IbPortSlow", [_snapshot("n1", hw, nics=within)]) == []
    unsaid = NodeHardware()
    assert _fire("IbPortMissing", [_snapshot("n1", unsaid, nics=nics)]) == []
    assert _fire("IbPortSlow", [_snapshot("n1", unsaid, nics=nics)]) == []


def test_fabric_not_ready_per_gpu_and_when_the_fabric_manager_is_down() -> None:
    hw = NodeHardware(
        nvswitches=4,
        fabric_manager_running=False,
        gpus=_configs("n1", 2, **{"1": {"fabric_state": FABRIC_IN_PROGRESS, "fabric_ready": False}}),
    )
    alerts = _fire("GpuFabricNotReady", [_snapshot("n1", hw)])
    assert [a.labels.get("service") for a in alerts] == ["nv-fabricmanager", None]
    assert alerts[1].labels["gpu"] == "1"
    assert alerts[1].labels["state"] == FABRIC_IN_PROGRESS
    no_fabric = NodeHardware(
        nvswitches=0, gpus=_configs("n1", 2, **{"0": {"fabric_state": None, "fabric_ready": None}})
    )
    assert _fire("GpuFabricNotReady", [_snapshot("n1", no_fabric)]) == []


def _cluster(**odd: Any) -> list[NodeSnapshot]:
    """Four nodes alike, but for what ``odd`` gives node n4 (driver, peermem, GPU settings)."""
    out = []
    for i in range(1, 5):
        node = f"n{i}"
        changes = odd if node == "n4" else {}
        hw = NodeHardware(
            peermem_loaded=changes.get("peermem", True), gpus=_configs(node, 2, **changes.get("gpus", {}))
        )
        out.append(_snapshot(node, hw, driver=changes.get("driver", "550.127.08")))
    return out


def test_config_drift_against_the_clusters_majority() -> None:
    assert _fire("GpuConfigDrift", _cluster()) == []
    [driver] = _fire("GpuConfigDrift", _cluster(driver="535.183.01"))
    assert driver.labels["node"] == "n4"
    assert (driver.labels["setting"], driver.labels["value"], driver.labels["majority"]) == (
        "driver_version",
        "535.183.01",
        "550.127.08",
    )
    [peermem] = _fire("GpuConfigDrift", _cluster(peermem=False))
    assert (peermem.labels["setting"], peermem.labels["value"]) == ("nvidia_peermem", "0")
    [persistence] = _fire("GpuConfigDrift", _cluster(gpus={"1": {"persistence_mode": False}}))
    assert (persistence.labels["setting"], persistence.labels["gpu"]) == ("persistence_mode", "1")
    [ecc] = _fire("GpuConfigDrift", _cluster(gpus={"0": {"ecc_enabled": False}}))
    assert ecc.labels["setting"] == "ecc_mode"


def test_config_drift_needs_a_majority_among_enough_peers() -> None:
    two = [s for s in _cluster(driver="535.183.01") if s.node in ("n1", "n4")]
    assert _fire("GpuConfigDrift", two) == []  # 1 against 1: no majority
    halves = _cluster()
    halves = [s.replace(driver_version="535.183.01") if s.node in ("n3", "n4") else s for s in halves]
    assert _fire("GpuConfigDrift", halves) == []  # 2 against 2
    no_rdma = [s.replace(hardware=NodeHardware(peermem_loaded=None)) for s in _cluster()]
    assert [a.labels["setting"] for a in _fire("GpuConfigDrift", no_rdma)] == []


def test_config_drift_compares_a_gpus_settings_with_its_models_gpus() -> None:
    """Two L40S nodes with ECC off beside four H100 nodes with it on: each model is its own majority."""

    def l40s(node: str, ecc: tuple[bool, bool]) -> NodeSnapshot:
        gpus = tuple(GpuReading(node, i, f"GPU-{node}-{i}", "NVIDIA L40S", 0.0) for i in range(2))
        configs = tuple(GpuConfig(i, f"GPU-{node}-{i}", True, ecc[i]) for i in range(2))
        hw = NodeHardware(peermem_loaded=True, gpus=configs)
        return NodeSnapshot(node, 0.0, "nvml", gpus=gpus, driver_version="550.127.08", hardware=hw)

    assert _fire("GpuConfigDrift", [*_cluster(), l40s("l1", (False, False)), l40s("l2", (False, False))]) == []
    [odd] = _fire("GpuConfigDrift", [*_cluster(), l40s("l1", (False, False)), l40s("l2", (False, True))])
    assert (odd.labels["node"], odd.labels["gpu"], odd.labels["model"]) == ("l2", "1", "NVIDIA L40S")
    assert (odd.labels["value"], odd.labels["majority"]) == ("1", "0")


def test_config_drift_counts_a_gpu_listed_twice_once_with_its_last_value() -> None:
    """A node's hardware that lists a GPU twice (the per-unit path) judges as a listing of it once, with the value
    listed last (the by-maps path)."""
    once = _cluster(gpus={"1": {"persistence_mode": False}})
    hw = once[3].hardware
    assert hw is not None
    twice = [*once[:3], once[3].replace(hardware=dataclasses.replace(hw, gpus=(*_configs("n4", 2), *hw.gpus[1:])))]
    assert [a.labels for a in _fire("GpuConfigDrift", twice)] == [a.labels for a in _fire("GpuConfigDrift", once)]
    assert len(_fire("GpuConfigDrift", once)) == 1


def _series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    pairs = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{pairs}}}", "values": values}


def test_the_exported_rules_fire_under_promtool(promtool: str, tmp_path: Path) -> None:
    text = prometheus_rules_yaml(list(RULES.values()))
    (tmp_path / "rules.yml").write_text(text)
    entries = yaml.safe_load(text)["groups"][0]["rules"]

    def annotations(alert: str, summary: str, setting: str | None = None) -> dict[str, str]:
        entry = next(e for e in entries if e["alert"] == alert and e["labels"].get("setting") == setting)
        return {**entry["annotations"], "summary": summary}

    node = {"instance": "n1:9410", "job": "gpulens"}
    series = [
        _series("gpulens_node_gpu_missing", {**node, "node": "n1", "pci_bus_id": "0000:db:00.0"}, "1x40"),
        _series("gpulens_node_pci_gpus", {**node, "node": "n2"}, "7x40"),
        _series("gpulens_node_gpus_expected", {**node, "node": "n2"}, "8x40"),
        _series("gpulens_node_ib_ports_active", {**node, "node": "n1"}, "7x40"),
        _series("gpulens_node_ib_ports_expected", {**node, "node": "n1"}, "8x40"),
        _series("gpulens_node_ib_rate_expected_bytes_per_second", {**node, "node": "n1"}, "5e10x40"),
        _series("gpulens_node_fabric_manager_up", {**node, "node": "n1"}, "0x40"),
        _series("gpulens_gpu_fabric_ready", {**node, "node": "n1", "gpu": "3", "uuid": "GPU-3"}, "0x40"),
    ]
    port = {**node, "node": "n1", "device": "mlx5_1", "port": "1"}
    info = {**port, "link_layer": "InfiniBand", "gpus": "2", "pci_bus_id": "0000:3a:00.0"}
    series += [
        _series("gpulens_nic_up", port, "1x40"),
        _series("gpulens_nic_info", info, "1x40"),
        _series("gpulens_nic_link_speed_bytes_per_second", port, "2.5e10x40"),
    ]
    for i in range(
        1, 5
    ):  # four nodes, n4 on another driver and without peermem, its GPU 0 without persistence; n2's GPU 1 without ECC
        where = {"instance": f"n{i}:9410", "job": "gpulens", "node": f"n{i}"}
        driver = "535.183.01" if i == 4 else "550.127.08"
        for g in range(2):
            gpu = {**where, "gpu": str(g), "uuid": f"GPU-n{i}-{g}", "model": H100}
            series.append(_series("gpulens_gpu_info", {**gpu, "pci_bus_id": "x", "driver_version": driver}, "1x40"))
            series.append(_series("gpulens_gpu_persistence_mode", gpu, ("0" if (i, g) == (4, 0) else "1") + "x40"))
            series.append(_series("gpulens_gpu_ecc_enabled", gpu, ("0" if (i, g) == (2, 1) else "1") + "x40"))
        series.append(_series("gpulens_node_peermem_loaded", where, ("0" if i == 4 else "1") + "x40"))
    for g in range(4):  # four L40S boards with ECC off: peers of each other, not of the H100s
        l40s = {"instance": "n5:9410", "job": "gpulens", "node": "n5", "gpu": str(g), "uuid": f"GPU-n5-{g}"}
        series.append(_series("gpulens_gpu_ecc_enabled", {**l40s, "model": "NVIDIA L40S"}, "0x40"))
    expected = [
        {
            "alertname": "GpuMissing",
            "exp_alerts": [
                {
                    "exp_labels": {"severity": "critical", **node, "node": "n1", "pci_bus_id": "0000:db:00.0"},
                    "exp_annotations": annotations(
                        "GpuMissing",
                        "GpuMissing: n1 GPU 0000:db:00.0 is on the PCI bus but the driver does not open it.",
                    ),
                },
                {
                    "exp_labels": {"severity": "critical", **node, "node": "n2"},
                    "exp_annotations": annotations("GpuMissing", "GpuMissing: n2 has 7 GPUs, fewer than expected."),
                },
            ],
        },
        {
            "alertname": "IbPortMissing",
            "exp_alerts": [
                {
                    "exp_labels": {"severity": "critical", **node, "node": "n1"},
                    "exp_annotations": annotations(
                        "IbPortMissing", "IbPortMissing: n1 has 7 InfiniBand ports up, fewer than expected."
                    ),
                }
            ],
        },
        {
            "alertname": "IbPortSlow",
            "exp_alerts": [
                {
                    "exp_labels": {"severity": "warning", **port, "gpus": "2"},
                    "exp_annotations": annotations("IbPortSlow", "IbPortSlow on n1 port mlx5_1 1."),
                }
            ],
        },
        {
            "alertname": "GpuFabricNotReady",
            "exp_alerts": [
                {
                    "exp_labels": {"severity": "critical", **node, "node": "n1", "gpu": "3", "uuid": "GPU-3"},
                    "exp_annotations": annotations(
                        "GpuFabricNotReady", "GpuFabricNotReady: GPU n1:3 is not registered with the NVLink fabric."
                    ),
                },
                {
                    "exp_labels": {"severity": "critical", **node, "node": "n1", "service": "nv-fabricmanager"},
                    "exp_annotations": annotations(
                        "GpuFabricNotReady", "GpuFabricNotReady: nv-fabricmanager is not running on n1."
                    ),
                },
            ],
        },
        {
            "alertname": "GpuConfigDrift",
            "exp_alerts": [
                {
                    "exp_labels": {"severity": "warning", "setting": setting, "node": "n4", **extra},
                    "exp_annotations": annotations(
                        "GpuConfigDrift",
                        f"GpuConfigDrift: n4 runs {setting} {value}, unlike the cluster's majority.",
                        setting,
                    ),
                }
                for setting, value, extra in (
                    ("driver_version", "535.183.01", {"driver_version": "535.183.01"}),
                    ("nvidia_peermem", "0", {"value": "0"}),
                    ("persistence_mode", "0", {"value": "0", "gpu": "0", "uuid": "GPU-n4-0", "model": H100}),
                )
            ]
            + [
                {
                    "exp_labels": {
                        "severity": "warning",
                        "setting": "ecc_mode",
                        "node": "n2",
                        "value": "0",
                        "gpu": "1",
                        "uuid": "GPU-n2-1",
                        "model": H100,
                    },
                    "exp_annotations": annotations(
                        "GpuConfigDrift",
                        "GpuConfigDrift: n2 runs ecc_mode 0, unlike the cluster's majority.",
                        "ecc_mode",
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
