"""The nodes' hardware over Prometheus: the exporters' ``gpulens_node_*`` hardware families and each GPU's settings,
read back into the records the SQL store keeps (``NodeHardware``, ``storage.hardwarestore``), so that the engine
over Prometheus weighs what the engine over SQL weighs.

Four instant queries: every node gauge in one selector, the missing GPUs (``gpulens_node_gpu_missing == 1``),
every GPU's settings with the driver version, and the NVSwitch SXids the kernel log reported
(``gpulens_nvswitch_sxid_errors_total``). Prometheus holds the count of the GPUs on a node's PCI bus, not their
addresses: the record carries that count as the GPUs present (``nvml_gpus``, which ``gpus_present`` falls back on),
as the exported ``GpuMissing`` compares ``gpulens_node_pci_gpus or gpulens_node_nvml_gpus``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Final, Protocol

from gpulens.clock import Clock
from gpulens.nodehardware import FABRIC_STATES, GpuConfig, NodeHardware
from gpulens.storage.prometheus.client import PromClient, regex_of

# NodeHardware field -> its family (what the exporter's hardware families render)
NODE_FAMILIES: Final = {
    "pci_gpus": "gpulens_node_pci_gpus",
    "nvml_gpus": "gpulens_node_nvml_gpus",
    "gpus_expected": "gpulens_node_gpus_expected",
    "ib_ports_expected": "gpulens_node_ib_ports_expected",
    "ib_rate_expected_bytes_per_second": "gpulens_node_ib_rate_expected_bytes_per_second",
    "ib_ports_active": "gpulens_node_ib_ports_active",
    "nvswitches": "gpulens_node_nvswitches",
    "fabric_manager_running": "gpulens_node_fabric_manager_up",
    "peermem_loaded": "gpulens_node_peermem_loaded",
}
GPU_FAMILIES: Final = {
    "persistence_mode": "gpulens_gpu_persistence_mode",
    "ecc_enabled": "gpulens_gpu_ecc_enabled",
    "fabric_ready": "gpulens_gpu_fabric_ready",
    "fabric_state": "gpulens_gpu_fabric_state",
}
_BOOLS: Final = frozenset(
    {"fabric_manager_running", "peermem_loaded", "persistence_mode", "ecc_enabled", "fabric_ready"}
)


class PromReader(Protocol):
    """What this read uses of ``gpulens.storage.prometheus.reader.PromReader`` (which calls it)."""

    client: PromClient
    clock: Clock


def _selector(families: Sequence[str], nodes: Sequence[str] | None) -> str:
    node = f", node=~{regex_of(nodes)}" if nodes else ""
    return "{__name__=~" + regex_of(families) + node + "}"


def latest_hardware(
    reader: PromReader, nodes: Sequence[str] | None = None
) -> dict[str, tuple[NodeHardware, str | None]]:
    """Each node's hardware now and its driver version (of ``nodes`` only, if given), for the nodes whose exporter
    reports its hardware."""
    if nodes is not None and not nodes:
        return {}
    now = reader.clock.now()
    by_name = {family: field for field, family in NODE_FAMILIES.items()}
    gpu_by_name = {family: field for field, family in GPU_FAMILIES.items()}
    node = f", node=~{regex_of(nodes)}" if nodes else ""
    facts: dict[str, dict[str, Any]] = defaultdict(dict)
    for s in reader.client.query(_selector(list(NODE_FAMILIES.values()), nodes), now):
        field = by_name.get(s.labels.get("__name__", ""))
        if field and s.labels.get("node"):
            facts[s.labels["node"]][field] = bool(s.value) if field in _BOOLS else s.value
    missing: dict[str, list[str]] = defaultdict(list)
    for s in reader.client.query(f"gpulens_node_gpu_missing{{{node.lstrip(', ')}}} == 1", now):
        if s.labels.get("node") and s.labels.get("pci_bus_id"):
            missing[s.labels["node"]].append(s.labels["pci_bus_id"])
    sxids: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
    for s in reader.client.query(f"gpulens_nvswitch_sxid_errors_total{{{node.lstrip(', ')}}} > 0", now):
        where, address, code = s.labels.get("node"), s.labels.get("pci_bus_id"), s.labels.get("sxid", "")
        if where and address and code.isdigit():
            sxids[where].append((address, int(code), int(s.value)))
    gpus: dict[str, dict[tuple[int, str], dict[str, Any]]] = defaultdict(lambda: defaultdict(dict))
    drivers: dict[str, str] = {}
    for s in reader.client.query(_selector([*GPU_FAMILIES.values(), "gpulens_gpu_info"], nodes), now):
        name, labels = s.labels.get("__name__", ""), s.labels
        where = labels.get("node", "")
        if name == "gpulens_gpu_info":
            if labels.get("driver_version"):
                drivers[where] = labels["driver_version"]
            continue
        field = gpu_by_name.get(name)
        if field is None or not where or not labels.get("gpu", "").isdigit():
            continue
        value: Any = bool(s.value) if field in _BOOLS else None
        if field == "fabric_state":
            index = int(s.value) - 1
            value = FABRIC_STATES[index] if 0 <= index < len(FABRIC_STATES) else None
        gpus[where][(int(labels["gpu"]), labels.get("uuid", ""))][field] = value
    out = {}
    for where in sorted(set(facts) | set(missing) | set(sxids)):
        held = dict(facts.get(where, {}))
        pci = held.pop("pci_gpus", None)
        if pci is not None:  # the count only: the GPUs present, as gpus_present() falls back on nvml_gpus
            held["nvml_gpus"] = int(pci)
        for key in ("nvml_gpus", "gpus_expected", "ib_ports_expected", "ib_ports_active", "nvswitches"):
            if held.get(key) is not None:
                held[key] = int(held[key])
        configs = tuple(GpuConfig(g, uuid, **fields) for (g, uuid), fields in sorted(gpus.get(where, {}).items()))
        out[where] = (
            NodeHardware(
                missing_gpus=tuple(sorted(missing.get(where, ()))),
                gpus=configs,
                sxids=tuple(sorted(sxids.get(where, ()))),
                **held,
            ),
            drivers.get(where),
        )
    return out
