"""A node's health as the driver and the hardware tell it: ``Healthy``, ``Degraded`` or ``Unhealthy``, with its
reasons and one suggested action.

``node_health`` is the one function that judges a node. It reads one ``NodeSnapshot`` (what the exporter collected,
or what the store holds of the node) and weighs each finding: a lost GPU, a failed or pending row remapping, an
uncorrectable ECC error since the driver loaded, a PCIe link trained narrower than its maximum, NVLink links down,
an InfiniBand port that went down, a hung driver, and each finder added beside them. The exporter serves its result
in ``/metrics`` (``gpulens_node_health{state}``) and the snapshot, ``gpulens node-health`` prints it for Slurm's health
check, and the dashboard colours the overview's nodes by it.

Actions are one vocabulary, ordered from least to most intrusive: ``none``, ``check-application``, ``reset-gpu``,
``reboot``, ``hardware-inspection``. A node's action is the most intrusive of its findings'.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from gpulens.model import GpuReading, NodeSnapshot

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


def driver_findings(snapshot: NodeSnapshot) -> Iterator[Finding]:
    """A driver whose NVML calls do not return (``nvml_hung_since``: an NVML call passed its deadline)."""
    if snapshot.nvml_hung_since is not None:
        yield Finding("node", UNHEALTHY, "the GPU driver is hung: an NVML call does not return", "reboot")


FINDERS: Final[tuple[Finder, ...]] = (gpu_findings, link_findings, port_findings, driver_findings)


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
