"""A node's health as the driver and the hardware tell it: ``Healthy``, ``Degraded`` or ``Unhealthy``, with its
reasons and one suggested action.

``node_health`` is the one function that judges a node. It reads one ``NodeSnapshot`` (what the exporter collected,
or what the store holds of the node) and weighs each finding:

- a lost GPU, a failed or pending row remapping, an uncorrectable ECC error since the driver loaded, a PCIe link
  trained narrower than its maximum, NVLink links down, an InfiniBand port that went down, a hung driver;
- each XID and SXid as the XID catalogue weighs it (``gpulens.xidcatalogue``: its severity and its action,
  escalated after repeats across reboots). An XID counts from the exporter's start: the node stays unhealthy until
  the exporter restarts (a reboot does);
- the node's hardware against what it should be (``gpulens.nodehardware``: GPUs NVML does not open, missing or slow
  ports, the NVLink fabric and its manager, ``nvidia_peermem``).

The exporter serves the result in ``/metrics`` (``gpulens_node_health{state}``) and the snapshot, and ``gpulens
node-health`` prints it for Slurm's health check.

Actions are one vocabulary, ordered from least to most intrusive: ``none``, ``check-application``, ``reset-gpu``,
``reboot``, ``hardware-inspection``. A node's action is the most intrusive of its findings'.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gpulens.model import GpuReading, NodeSnapshot
from gpulens.xidcatalogue import SXID_BY_CODE, XID_BY_CODE, sxid_severity, xid_action, xid_name

HEALTHY: Final = "Healthy"
DEGRADED: Final = "Degraded"
UNHEALTHY: Final = "Unhealthy"
STATES: Final = (HEALTHY, DEGRADED, UNHEALTHY)  # in order of gravity; ``gpulens node-health`` exits with the index
ACTIONS: Final = ("none", "check-application", "reset-gpu", "reboot", "hardware-inspection")


@dataclass(frozen=True, slots=True)
class Finding:
    """One reason a node is not healthy: what (``subject``: ``GPU 3``, ``mlx5_0 port 1``, ``node``), the state it
    puts the node in, one line saying why, and the action that fixes it."""

    subject: str
    state: str
    reason: str
    action: str

    def text(self) -> str:
        return f"{self.subject}: {self.reason} (action: {self.action})"


@dataclass(frozen=True, slots=True)
class NodeHealth:
    """The node's state (the gravest of its findings'), its findings, and the one action suggested."""

    state: str
    findings: tuple[Finding, ...]
    action: str

    @property
    def exit_code(self) -> int:
        """0 healthy, 1 degraded, 2 unhealthy: what ``gpulens node-health`` exits with."""
        return STATES.index(self.state)

    def to_json(self) -> dict[str, object]:
        return {
            "state": self.state,
            "action": self.action,
            "findings": [
                {"subject": f.subject, "state": f.state, "reason": f.reason, "action": f.action} for f in self.findings
            ],
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> NodeHealth:
        """What ``to_json`` wrote (a store keeps it), read back; ``ValueError`` for anything else."""
        try:
            state = str(doc["state"])
            if state not in STATES:
                raise ValueError(f"unknown node health state {state!r}")
            findings = tuple(
                Finding(str(f["subject"]), str(f["state"]), str(f["reason"]), str(f["action"]))
                for f in doc.get("findings", ())
            )
            return cls(state, findings, str(doc.get("action") or "none"))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a node health document: {exc!r:.80}") from None


Finder = Callable[[NodeSnapshot], Iterable[Finding]]


def _gpu(reading: GpuReading) -> str:
    return f"GPU {reading.gpu}" + (f" ({reading.pci_bus_id})" if reading.pci_bus_id else "")


def gpu_findings(snapshot: NodeSnapshot) -> Iterator[Finding]:
    """What each GPU's own readings say."""
    for g in snapshot.gpus:
        subject = _gpu(g)
        if not g.up:
            yield Finding(subject, UNHEALTHY, "the GPU does not answer (lost, fallen off the bus)", "reboot")
            continue
        if g.remapped_rows_failure:
            yield Finding(subject, UNHEALTHY, "a row remapping failed: memory it cannot repair", "hardware-inspection")
        elif g.remapped_rows_pending or g.retired_pages_pending:
            yield Finding(subject, DEGRADED, "a memory row waits to be remapped at the next GPU reset", "reset-gpu")
        if g.ecc_uncorrected_errors_total:
            yield Finding(
                subject,
                DEGRADED,
                f"{g.ecc_uncorrected_errors_total} uncorrectable ECC errors since the driver loaded",
                "reset-gpu",
            )
        if g.pcie_link_width is not None and g.pcie_link_width_max and g.pcie_link_width < g.pcie_link_width_max:
            yield Finding(
                subject,
                DEGRADED,
                f"PCIe link x{g.pcie_link_width} instead of x{g.pcie_link_width_max}",
                "hardware-inspection",
            )


def link_findings(snapshot: NodeSnapshot) -> Iterator[Finding]:
    """NVLink links down on a GPU whose other links are up (a GPU with none up has no NVLink to speak of)."""
    by_gpu: dict[int, list[bool]] = {}
    for link in snapshot.links:
        by_gpu.setdefault(link.gpu, []).append(link.active)
    for gpu, states in sorted(by_gpu.items()):
        down = states.count(False)
        if down and down < len(states):
            yield Finding(f"GPU {gpu}", DEGRADED, f"{down} of {len(states)} NVLink links down", "hardware-inspection")


def port_findings(snapshot: NodeSnapshot) -> Iterator[Finding]:
    """InfiniBand and RoCE ports that went down (their link_downed counter moved) and are not up now."""
    for nic in snapshot.nics:
        if not nic.up and nic.link_downed_total:
            yield Finding(f"{nic.device} port {nic.port}", DEGRADED, "the port is down", "hardware-inspection")


_XID_STATE: Final = {"critical": UNHEALTHY, "warning": DEGRADED}  # an info XID (an application's) leaves it healthy


def xid_findings(snapshot: NodeSnapshot) -> Iterator[Finding]:
    """Each XID a GPU reported since the exporter started, as the XID catalogue weighs it (its severity, its action
    after the occurrences counted across reboots), and the kernel log's SXids and Xids on addresses no GPU has."""
    escalated = {(a.uuid, a.xid): a.action for a in snapshot.kernel.actions} if snapshot.kernel else {}
    for g in snapshot.gpus:
        for code, count in sorted(g.xid_errors.items()):
            entry = XID_BY_CODE.get(code)
            state = _XID_STATE.get(entry.severity if entry else "warning")
            if count and state:
                action = escalated.get((g.uuid, code)) or xid_action(code)
                yield Finding(
                    _gpu(g), state, f"XID {code} ({xid_name(code)}), {count} since the exporter started", action
                )
    if snapshot.kernel is None:
        return
    for address, code, count in snapshot.kernel.node_xids:
        entry = XID_BY_CODE.get(code)
        state = _XID_STATE.get(entry.severity if entry else "warning")
        if count and state:
            yield Finding(
                f"PCI {address}", state, f"XID {code} ({xid_name(code)}) on no GPU NVML sees", xid_action(code)
            )
    for address, code, count in snapshot.kernel.sxids:
        switch = SXID_BY_CODE.get(code)
        if count:
            state = UNHEALTHY if sxid_severity(code) == "fatal" else DEGRADED
            action = switch.action if switch is not None else "reboot"
            yield Finding(f"NVSwitch {address}", state, f"SXid {code}, {count} events", action)


def hardware_findings(snapshot: NodeSnapshot) -> Iterator[Finding]:
    """The node's hardware against what it should be: GPUs NVML does not open, fewer GPUs or InfiniBand ports than
    expected, slow ports, the NVLink fabric not ready, GPUDirect RDMA's module missing."""
    hw = snapshot.hardware
    if hw is None:
        return
    for address in hw.missing_gpus:
        yield Finding(f"PCI {address}", UNHEALTHY, "a GPU on the PCI bus that NVML does not open", "reboot")
    seen = len(hw.pci_gpus) if hw.pci_gpus is not None else hw.nvml_gpus
    if hw.gpus_expected is not None and seen is not None and seen < hw.gpus_expected:
        reason = f"{seen} GPUs on the node, {hw.gpus_expected} expected"
        yield Finding("node", UNHEALTHY, reason, "hardware-inspection")
    expected, active = hw.ib_ports_expected, hw.ib_ports_active
    if expected is not None and active is not None and active < expected:
        reason = f"{active} InfiniBand ports up, {expected} expected"
        yield Finding("node", DEGRADED, reason, "hardware-inspection")
    for device, port, _rate in hw.ib_ports_slow:
        yield Finding(f"{device} port {port}", DEGRADED, "below the expected rate", "hardware-inspection")
    if hw.nvswitches and hw.fabric_manager_running is False:
        yield Finding("node", UNHEALTHY, "nv-fabricmanager is not running on an NVSwitch node", "reboot")
    for gpu in hw.gpus:
        if gpu.fabric_ready is False:
            yield Finding(f"GPU {gpu.gpu}", UNHEALTHY, f"NVLink fabric not ready ({gpu.fabric_state})", "reboot")
    if hw.peermem_loaded is False:
        yield Finding("node", DEGRADED, "nvidia_peermem is not loaded (no GPUDirect RDMA)", "reboot")


def driver_findings(snapshot: NodeSnapshot) -> Iterator[Finding]:
    """A driver whose NVML calls do not return (``nvml_hung_since``: an NVML call passed its deadline)."""
    if snapshot.nvml_hung_since is not None:
        yield Finding("node", UNHEALTHY, "the GPU driver is hung: an NVML call does not return", "reboot")


FINDERS: Final[tuple[Finder, ...]] = (
    gpu_findings,
    link_findings,
    port_findings,
    driver_findings,
    xid_findings,
    hardware_findings,
)


def judge(findings: Sequence[Finding]) -> NodeHealth:
    """The node's health from its findings: the gravest state, the most intrusive action."""
    if not findings:
        return NodeHealth(HEALTHY, (), "none")
    state = max((f.state for f in findings), key=STATES.index)
    action = max((f.action for f in findings), key=ACTIONS.index)
    ordered = sorted(findings, key=lambda f: (-STATES.index(f.state), -ACTIONS.index(f.action), f.subject))
    return NodeHealth(state, tuple(ordered), action)


def node_health(snapshot: NodeSnapshot, finders: Sequence[Finder] = FINDERS) -> NodeHealth:
    """The health of the node of ``snapshot`` (see the module's docstring)."""
    return judge([finding for finder in finders for finding in finder(snapshot)])
