"""The node's hardware against what it should be: GPUs on the PCI bus, the GPU fabric, the node's plumbing.

One ``NodeHardware`` per node snapshot (``NodeSnapshot.hardware``), filled by the node agent's hardware reader
(``exporter/hardware.py``, docs/exporter.md "Expected hardware") and by the NVML source (each GPU's ``GpuConfig``):

- ``pci_gpus``: the NVIDIA GPUs the PCI bus shows (vendor 0x10de, class display 0x0300 or 3D 0x0302), whether or
  not NVML opens them; ``missing_gpus``: those of them no GPU reading names (NVML never opened them, so no
  ``GpuReading`` exists: a GPU lost before the agent started). A GPU NVML opened and then lost is a reading with
  ``up = False`` (``GpuLost``), not a missing one;
- the operator's expectation (``--expect-gpus``, ``--expect-ib-ports``, ``--expect-ib-rate-gbps``);
- NVSwitch systems: the NVSwitches on the bus and whether ``nv-fabricmanager`` runs; each GPU's fabric state;
- GPUDirect RDMA: whether ``nvidia_peermem`` is loaded (``None`` where the node has no RDMA port);
- each GPU's persistence and ECC modes (the driver version is ``NodeSnapshot.driver_version``);
- the NVSwitch SXids the kernel log reported since the agent started (``NvswitchFatalSxid``), copied here from the
  kernel view (``with_sxids``) so that the store and the rules see them with the rest of the node's hardware.

PCI addresses are written as sysfs writes them, ``"0000:3b:00.0"`` (``sysfs_bus_id``). ``None`` is unknown.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Final

from gpulens.fabricmodel import LINK_LAYER_INFINIBAND, NicReading

# NVML's nvmlGpuFabricState_t, by name: the GPU's registration with the NVLink fabric (NVSwitch systems).
FABRIC_NOT_STARTED: Final = "not_started"
FABRIC_IN_PROGRESS: Final = "in_progress"
FABRIC_COMPLETED: Final = "completed"
FABRIC_STATES: Final = (FABRIC_NOT_STARTED, FABRIC_IN_PROGRESS, FABRIC_COMPLETED)

# A port within 1 % of the expected rate runs at it (IbPortSlow): the kernel and ibstat round the rate.
IB_RATE_TOLERANCE: Final = 0.99

_BUS_ID: Final = re.compile(r"([0-9a-fA-F]{1,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])")


def sysfs_bus_id(bus_id: str) -> str | None:
    """A PCI address as sysfs names it: NVML's ``"00000000:3B:00.0"`` becomes ``"0000:3b:00.0"``; ``None`` if bad."""
    match = _BUS_ID.fullmatch(bus_id.strip())
    if match is None:
        return None
    domain, bus, device, function = match.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}.{function}"


@dataclass(frozen=True)
class GpuConfig:
    """One GPU's settings as NVML reports them: what the cluster's nodes should agree on (``GpuConfigDrift``).

    ``fabric_state`` is one of ``FABRIC_STATES`` and ``fabric_ready`` whether the state is completed with a
    success status; both ``None`` where the driver does not offer the fabric state (no NVSwitch fabric)."""

    gpu: int
    uuid: str
    persistence_mode: bool | None = None
    ecc_enabled: bool | None = None
    fabric_state: str | None = None
    fabric_ready: bool | None = None


@dataclass(frozen=True)
class NodeHardware:
    """What the node's hardware is against what it should be; see the module docstring. What the alert rules weigh
    is here, counted at the source, so that a round read back from a store (which holds no ports) judges it too."""

    pci_gpus: tuple[str, ...] | None = None
    missing_gpus: tuple[str, ...] = ()
    nvml_gpus: int | None = None  # GPU readings the source gave (up or lost)
    gpus_expected: int | None = None
    ib_ports_expected: int | None = None
    ib_rate_expected_bytes_per_second: float | None = None
    ib_ports_active: int | None = None  # InfiniBand ports up (``ib_ports_active``), counted where the ports are read
    # The InfiniBand ports up below the expected rate (``ib_ports_slow``): (device, port, rate in bytes per second).
    ib_ports_slow: tuple[tuple[str, int, float], ...] = ()
    nvswitches: int | None = None  # NVSwitches on the PCI bus (vendor 0x10de, class bridge 0x0680)
    fabric_manager_running: bool | None = None  # read on NVSwitch nodes only
    peermem_loaded: bool | None = None  # read where RDMA ports exist
    gpus: tuple[GpuConfig, ...] = ()
    # The NVSwitch SXids since the agent started: (switch PCI address, SXid, events), one count per event.
    sxids: tuple[tuple[str, int, int], ...] = ()

    def gpus_present(self) -> int | None:
        """The GPUs the node has: those on its PCI bus, or NVML's count where the bus could not be read."""
        return len(self.pci_gpus) if self.pci_gpus is not None else self.nvml_gpus


def with_sxids(hardware: NodeHardware | None, sxids: tuple[tuple[str, int, int], ...]) -> NodeHardware | None:
    """The node's hardware carrying the kernel log's SXids; ``None`` stays ``None`` while there are none."""
    if hardware is None:
        return NodeHardware(sxids=sxids) if sxids else None
    return hardware if hardware.sxids == sxids else replace(hardware, sxids=sxids)


def missing_gpus(pci_gpus: Iterable[str], reading_bus_ids: Iterable[str | None]) -> tuple[str, ...]:
    """The GPUs on the bus that no reading names (both sides compared as ``sysfs_bus_id``)."""
    seen = {sysfs_bus_id(b) for b in reading_bus_ids if b}
    return tuple(sorted(b for b in pci_gpus if sysfs_bus_id(b) not in seen))


def ib_ports_active(nics: Sequence[NicReading]) -> int:
    """The node's InfiniBand ports that are up (ACTIVE and LinkUp): what ``--expect-ib-ports`` is compared with."""
    return sum(1 for n in nics if n.up and n.link_layer == LINK_LAYER_INFINIBAND)


def ib_ports_slow(nics: Sequence[NicReading], expected: float | None) -> tuple[tuple[str, int, float], ...]:
    """The InfiniBand ports up below ``expected`` bytes per second (``IB_RATE_TOLERANCE`` allowed), as
    (device, port, rate); none without an expectation."""
    if expected is None:
        return ()
    return tuple(
        (n.device, n.port, n.rate_bytes_per_second)
        for n in nics
        if n.up
        and n.link_layer == LINK_LAYER_INFINIBAND
        and n.rate_bytes_per_second is not None
        and n.rate_bytes_per_second < expected * IB_RATE_TOLERANCE
    )


def gbps_to_bytes_per_second(gbps: float) -> float:
    """A link rate as ``ibstat`` and the flag write it (Gb/s, 10^9 bits) in bytes per second."""
    return gbps * 1e9 / 8
