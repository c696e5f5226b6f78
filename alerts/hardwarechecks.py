"""The node's hardware rules: GPUs missing, InfiniBand ports missing or slow against the expectation, the NVLink fabric
not ready, and a node whose GPU settings differ from the cluster's majority.

Each check is a pure function of a rule, the history and ``now`` (like ``alerts.checks``) over the latest round's
``hardware`` (``gpulens.nodehardware``, one per node whose agent reads it), its driver versions and its RDMA ports
(``History.fabric``). A node whose agent does not read its hardware (a dcgm-exporter page) is never judged.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from itertools import compress
from operator import attrgetter
from typing import Final

from gpulens.alerts.base import AlertRule, Candidate, rule_labels
from gpulens.alerts.fabricchecks import gpus_text, port_place
from gpulens.alerts.history import History
from gpulens.fabricmodel import LINK_LAYER_INFINIBAND
from gpulens.nodehardware import IB_RATE_TOLERANCE, NodeHardware, ib_ports_active
from gpulens.xidcatalogue import sxid_action, sxid_name, sxid_severity

# The settings GpuConfigDrift compares, in the order it reports them: per node, then per GPU.
SETTING_DRIVER: Final = "driver_version"
SETTING_PEERMEM: Final = "nvidia_peermem"
SETTING_PERSISTENCE: Final = "persistence_mode"
SETTING_ECC: Final = "ecc_mode"


def _node_candidate(
    rule: AlertRule,
    node: str,
    amount: float | None,
    what: str,
    description: str,
    extra: Mapping[str, str] | None = None,
) -> Candidate:
    labels = rule_labels(rule, {"node": node, **(extra or {})})
    return Candidate(rule.name, labels, amount, f"{node}: {what}", description)


def gpu_missing(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    latest = history.latest
    if latest is None:
        return []
    out: list[Candidate] = []
    for node, hw in sorted(latest.hardware.items()):
        out.extend(
            _node_candidate(
                rule,
                node,
                1.0,
                f"GPU {bus_id} is on the PCI bus but the driver does not open it",
                f"The PCI bus shows an NVIDIA GPU at {bus_id} that NVML never opened: it was lost before the "
                "agent started, or the driver failed to initialise it (the kernel log's NVRM lines say why).",
                {"pci_bus_id": bus_id},
            )
            for bus_id in hw.missing_gpus
        )
        present, expected = hw.gpus_present(), hw.gpus_expected
        if expected is not None and present is not None and present < expected:
            out.append(
                _node_candidate(
                    rule,
                    node,
                    float(expected - present),
                    f"{present} of {expected} expected GPUs present",
                    f"The node should have {expected} GPUs (--expect-gpus); its PCI bus shows {present}: a GPU has "
                    "dropped off the bus entirely (no address to name).",
                )
            )
    return out


def ib_port_missing(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    latest = history.latest
    if latest is None:
        return []
    out = []
    for node, hw in sorted(latest.hardware.items()):
        expected = hw.ib_ports_expected
        if expected is None:
            continue
        nics = history.fabric.node_nics(node)
        active = hw.ib_ports_active if hw.ib_ports_active is not None else ib_ports_active(nics)
        if active < expected:
            down = sorted(f"{n.device}/{n.port}" for n in nics if n.link_layer == LINK_LAYER_INFINIBAND and not n.up)
            out.append(
                _node_candidate(
                    rule,
                    node,
                    float(expected - active),
                    f"{active} of {expected} expected InfiniBand ports up",
                    f"The node should have {expected} InfiniBand ports up (--expect-ib-ports); {active} are ACTIVE "
                    f"and LinkUp. Ports present but not up: {', '.join(down) or 'none (the HCA or port is absent)'}.",
                )
            )
    return out


_SLOW_DESCRIPTION: Final = (
    "The port trained below the rate the node should run at (--expect-ib-rate-gbps): a lane is down or the cable, "
    "transceiver or switch port negotiated a lower speed since the node booted."
)


def _rates(rate: float, expected: float) -> str:
    return f"runs at {rate * 8 / 1e9:g} Gb/s, expected {expected * 8 / 1e9:g} Gb/s"


def ib_port_slow(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    """The round's ports where it has them (with their GPUs and jobs); else the slow ports the agent counted (a round
    read back from a store holds no ports)."""
    latest = history.latest
    if latest is None:
        return []
    out = []
    for node, hw in sorted(latest.hardware.items()):
        expected = hw.ib_rate_expected_bytes_per_second
        if expected is None:
            continue
        nics = history.fabric.node_nics(node)
        if not nics:
            for device, port, counted in hw.ib_ports_slow:
                subject = {"node": node, "device": device, "port": str(port)}
                what = f"{node} {device} port {port}: {_rates(counted, expected)}"
                out.append(Candidate(rule.name, rule_labels(rule, subject), counted, what, _SLOW_DESCRIPTION))
            continue
        for nic in nics:
            rate = nic.rate_bytes_per_second
            if not nic.up or nic.link_layer != LINK_LAYER_INFINIBAND or rate is None:
                continue
            if rate >= expected * IB_RATE_TOLERANCE:
                continue
            jobs = history.fabric.port_jobs(nic)
            subject = {"node": node, "device": nic.device, "port": str(nic.port), "gpus": gpus_text(nic.gpus)}
            if jobs:
                subject["job_id"] = ",".join(jobs)
            what = f"{port_place(nic, jobs)}: {_rates(rate, expected)}"
            out.append(Candidate(rule.name, rule_labels(rule, subject), rate, what, _SLOW_DESCRIPTION))
    return out


def nvswitch_fatal_sxid(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    """One alert per switch and fatal SXid the node's kernel log reported since its agent started."""
    latest = history.latest
    if latest is None:
        return []
    out = []
    for node, hw in sorted(latest.hardware.items()):
        for address, code, events in hw.sxids:
            if events <= 0 or sxid_severity(code) != "fatal":
                continue
            name, action = sxid_name(code), sxid_action(code)
            out.append(
                _node_candidate(
                    rule,
                    node,
                    float(events),
                    f"NVSwitch {address} reported SXid {code} ({name}; action: {action})",
                    f"The kernel log shows {events} fatal SXid {code} event(s), {name}, on the NVSwitch at {address}: "
                    f"the switch or its NVLinks need a reset, and the jobs whose GPUs use it fail. Action: {action}.",
                    {"pci_bus_id": address, "sxid": str(code)},
                )
            )
    return out


def gpu_fabric_not_ready(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    latest = history.latest
    if latest is None:
        return []
    out = []
    for node, hw in sorted(latest.hardware.items()):
        if hw.nvswitches and hw.fabric_manager_running is False:
            out.append(
                _node_candidate(
                    rule,
                    node,
                    0.0,
                    "nv-fabricmanager is not running on an NVSwitch node",
                    f"The node has {hw.nvswitches} NVSwitches but no nv-fabricmanager process: GPUs cannot join "
                    "the NVLink fabric, and CUDA fails to start there (cudaErrorSystemNotReady).",
                    {"service": "nv-fabricmanager"},
                )
            )
        for c in hw.gpus:
            if c.fabric_ready is not False:
                continue
            out.append(
                _node_candidate(
                    rule,
                    node,
                    0.0,
                    f"GPU {c.gpu} is not registered with the NVLink fabric (state {c.fabric_state})",
                    "NVML reports the GPU's fabric registration incomplete or failed: until the fabric manager "
                    "completes it, CUDA fails to start on the GPU (cudaErrorSystemNotReady).",
                    {"gpu": str(c.gpu), "uuid": c.uuid, "state": c.fabric_state or ""},
                )
            )
    return out


# One node or GPU holding a value of one setting: (node, GPU index or "", UUID or "", model or ""); the model's GPUs
# are its peers. Plain tuples: the drift check builds one per GPU each round (8,000 at 1,000 nodes).
_Unit = tuple[str, str, str, str]
_UUID: Final = attrgetter("uuid")
_GPU: Final = attrgetter("gpu")
_PERSISTENCE: Final = attrgetter("persistence_mode")
_ECC: Final = attrgetter("ecc_enabled")


_Group = tuple[Counter[str], Mapping[_Unit, str]]  # a group's values' counts, and its units with their values


def _settings(history: History) -> Iterable[tuple[str, list[_Group]]]:
    """Each setting's groups: per node (driver, peermem: one group) or per GPU (persistence, ECC: a group per model,
    so that a fleet's inference boards with their own defaults are not every training node's odd ones). A group is
    its values' counts and its units with their values: every unit whose value is not the group's most common."""
    latest = history.latest
    if latest is None:
        return
    drivers = {(n, "", "", ""): v for n, v in latest.drivers.items() if n in latest.hardware}
    yield SETTING_DRIVER, [(Counter(drivers.values()), drivers)]
    peermem = {
        (n, "", "", ""): _on(hw.peermem_loaded) for n, hw in latest.hardware.items() if hw.peermem_loaded is not None
    }
    yield SETTING_PEERMEM, [(Counter(peermem.values()), peermem)]
    hardware, gpus = latest.hardware, latest.gpus
    configs = [c for hw in hardware.values() for c in hw.gpus]
    uuids = list(map(_UUID, configs))
    models = [r.model if r else "" for r in map(gpus.get, uuids)]
    if len(set(uuids)) < len(uuids):  # a GPU listed twice: one unit, its last value (``_by_unit``)
        yield from _by_unit(hardware, models)
        return
    # Each GPU once (the common case, 8,000 at 1,000 nodes): counts by maps, and the units of only the GPUs apart
    # from their model's more common value (few) built.
    nodes: list[str] | None = None
    for setting, read in ((SETTING_PERSISTENCE, _PERSISTENCE), (SETTING_ECC, _ECC)):
        values = list(map(read, configs))
        raw = Counter(zip(models, values, strict=True))  # in order of first appearance
        counts: dict[str, Counter[str]] = {}
        for (model, value), held in raw.items():
            if value is not None:
                counts.setdefault(model, Counter())[_on(value)] += held
        apart = {}  # model -> its less common value, where it has two
        for model, count in counts.items():
            if len(count) == 2 and count["1"] != count["0"]:
                apart[model] = "1" if count["1"] < count["0"] else "0"
        groups = {model: (count, dict[_Unit, str]()) for model, count in counts.items()}
        keys = {(m, v) for m, v in raw if v is not None and _on(v) == apart.get(m)}
        for i in compress(range(len(configs)), map(keys.__contains__, zip(models, values, strict=True))):
            nodes = nodes or [node for node, hw in hardware.items() for _ in hw.gpus]
            unit = (nodes[i], str(configs[i].gpu), uuids[i], models[i])
            groups[models[i]][1][unit] = _on(values[i])
        yield setting, list(groups.values())


def _by_unit(hardware: Mapping[str, NodeHardware], models: list[str]) -> Iterable[tuple[str, list[_Group]]]:
    """The per-GPU settings' groups, each GPU a unit once (its last value where it is listed twice)."""
    persistence: dict[str, dict[_Unit, str]] = {}
    ecc: dict[str, dict[_Unit, str]] = {}
    models_left = iter(models)
    for node, hw in hardware.items():
        for c in hw.gpus:
            model = next(models_left)
            unit = (node, str(c.gpu), c.uuid, model)
            if c.persistence_mode is not None:
                persistence.setdefault(model, {})[unit] = _on(c.persistence_mode)
            if c.ecc_enabled is not None:
                ecc.setdefault(model, {})[unit] = _on(c.ecc_enabled)
    yield SETTING_PERSISTENCE, [(Counter(group.values()), group) for group in persistence.values()]
    yield SETTING_ECC, [(Counter(group.values()), group) for group in ecc.values()]


def _on(value: bool) -> str:
    return "1" if value else "0"


def majority(counts: Counter[str], min_count: float) -> str | None:
    """The value more than half of the counted values hold, when there are at least ``min_count`` of them; else
    None."""
    total = sum(counts.values())
    if total < min_count or not counts:
        return None
    value, top = counts.most_common(1)[0]
    return value if top * 2 > total else None


def gpu_config_drift(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    min_peers = rule.threshold("min_peers")
    out = []
    for setting, groups in _settings(history):
        for counts, units in groups:
            usual = majority(counts, min_peers)
            if usual is not None:
                out += _drifted(rule, setting, units, usual)
    return out


def _drifted(rule: AlertRule, setting: str, values: Mapping[_Unit, str], usual: str) -> list[Candidate]:
    out = []
    odd = [(unit, value) for unit, value in values.items() if value != usual]  # few: only they are sorted
    for (node, gpu, uuid, model), value in sorted(odd, key=lambda item: (item[0][0], item[0][1])):
        where = f"GPU {gpu} " if gpu else ""
        extra = {"gpu": gpu, "uuid": uuid, "model": model} if gpu else {}
        peers = f"{model} GPUs" if model else "GPUs" if gpu else "nodes"
        out.append(
            _node_candidate(
                rule,
                node,
                None,
                f"{where}{setting} is {value}, the cluster's majority {usual}",
                f"Most of the cluster's {peers} run {setting} = {usual}; this one runs {value}. A node configured "
                "apart from its peers behaves apart: a driver mismatch breaks NCCL between nodes, persistence off adds "
                "seconds to every job start, ECC off hides memory errors, and without nvidia_peermem GPUDirect RDMA "
                "falls back to copies through host memory.",
                {"setting": setting, "value": value, "majority": usual, **extra},
            )
        )
    return out
