"""NIC-to-GPU affinity: which GPUs each RDMA NIC serves, from the PCIe topology in sysfs.

A GPU and a NIC behind the same PCIe switch exchange data peer to peer without crossing the CPU's root complex:
that is the GPUDirect RDMA path NCCL prefers, and the NIC a GPU's traffic leaves by. The rule, applied per NIC:

1. Resolve each device's sysfs directory (``<root>/sys/bus/pci/devices/<domain:bus:dev.fn>`` is a symlink into
   ``/sys/devices/pci<domain>:<bus>/<root port>/<switch upstream port>/<switch downstream port>/.../<device>``)
   into its chain of components from the host bridge down.
2. The GPUs whose chain shares the longest prefix with the NIC's, provided that shared prefix goes below the root
   port (it contains a switch port), are its GPUs: nearest by switch. Two GPUs under the NIC's switch are both
   served; a GPU that shares only an upper switch loses to one that shares a lower one.
3. Otherwise, the GPUs on the NIC's NUMA node (``numa_node``; -1 means unknown), else none.

The topology is read once per PCI address and cached: PCIe does not rearrange itself while the agent runs.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from gpulens.exporter.fabric.sysread import AttributeReader
from gpulens.fabricmodel import NicReading

VIA_PCIE_SWITCH: Final = "pcie_switch"
VIA_NUMA_NODE: Final = "numa_node"

_HOST_BRIDGE: Final = re.compile(r"pci[0-9a-f]{4,8}:[0-9a-f]{2}")
_PCI_ADDRESS: Final = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_ANY_PCI_ADDRESS: Final = re.compile(r"([0-9a-fA-F]{1,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])")
# chain[0] is the host bridge, chain[1] the root port: a shared prefix longer than that contains a switch port
_BELOW_ROOT_PORT: Final = 3


def sysfs_bus_id(bus_id: str) -> str | None:
    """A PCI address as sysfs names it: NVML's ``"00000000:18:00.0"`` becomes ``"0000:18:00.0"``; ``None`` if bad."""
    match = _ANY_PCI_ADDRESS.fullmatch(bus_id.strip())
    if match is None:
        return None
    domain, bus, device, function = match.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}.{function}"


@dataclass(frozen=True, slots=True)
class PciPlace:
    """Where a PCI device sits: its address, its chain from the host bridge down (itself last), its NUMA node."""

    bus_id: str
    chain: tuple[str, ...]
    numa_node: int | None = None


@dataclass(frozen=True, slots=True)
class NicAffinity:
    """The GPUs a NIC serves (indices, ascending) and why: ``"pcie_switch"``, ``"numa_node"`` or ``None``."""

    gpus: tuple[int, ...] = ()
    via: str | None = None


def place_of(real_path: str, numa_node: int | None = None) -> PciPlace | None:
    """The place of a device from its resolved sysfs path; ``None`` when the path is not under a PCI host bridge."""
    parts = real_path.rstrip("/").split("/")
    start = next((i for i, part in enumerate(parts) if _HOST_BRIDGE.fullmatch(part)), None)
    if start is None or start == len(parts) - 1:
        return None
    chain = tuple(parts[start:])
    if not all(_PCI_ADDRESS.fullmatch(part) for part in chain[1:]):
        return None
    return PciPlace(bus_id=chain[-1], chain=chain, numa_node=numa_node)


def _shared_prefix(a: Sequence[str], b: Sequence[str]) -> int:
    shared = 0
    for left, right in zip(a, b, strict=False):
        if left != right:
            break
        shared += 1
    return shared


def nearest_gpus(nic: PciPlace, gpus: Mapping[int, PciPlace]) -> NicAffinity:
    """The GPUs ``nic`` serves: those under its deepest shared PCIe switch, else those on its NUMA node."""
    depths = {index: _shared_prefix(nic.chain, place.chain) for index, place in gpus.items()}
    best = max(depths.values(), default=0)
    if best >= _BELOW_ROOT_PORT:
        return NicAffinity(tuple(sorted(i for i, depth in depths.items() if depth == best)), VIA_PCIE_SWITCH)
    if nic.numa_node is not None:
        same_node = tuple(sorted(i for i, place in gpus.items() if place.numa_node == nic.numa_node))
        if same_node:
            return NicAffinity(same_node, VIA_NUMA_NODE)
    return NicAffinity()


class PciTopology:
    """Places PCI devices from ``<root>/sys/bus/pci/devices`` and assigns each NIC reading its GPUs.

    Failures never raise: an address that cannot be placed is counted once under ``affinity_unresolved`` and
    its NIC (or GPU) takes no part in the mapping.
    """

    def __init__(self, *, root: str = "/", reader: AttributeReader | None = None) -> None:
        self._devices = os.path.join(root, "sys", "bus", "pci", "devices")
        self._reader = reader if reader is not None else AttributeReader("affinity")
        self._places: dict[str, PciPlace | None] = {}

    @property
    def errors(self) -> Mapping[str, int]:
        return self._reader.errors

    def place(self, bus_id: str) -> PciPlace | None:
        """The place of the device at ``bus_id`` (NVML or sysfs spelling), cached."""
        address = sysfs_bus_id(bus_id)
        if address is None:
            self._reader.malformed(repr(bus_id), "a PCI address like 00000000:18:00.0")
            return None
        if address not in self._places:
            self._places[address] = self._locate(address)
        return self._places[address]

    def _locate(self, address: str) -> PciPlace | None:
        path = os.path.join(self._devices, address)
        place = place_of(os.path.realpath(path)) if os.path.exists(path) else None
        if place is None:
            self._reader.count("unresolved", "cannot place PCI device %s under %s", address, self._devices)
            return None
        numa = self._reader.integer(os.path.join(path, "numa_node"), signed=True)
        return dataclasses.replace(place, numa_node=None if numa is None or numa < 0 else numa)

    def affinities(self, nic_bus_ids: Iterable[str], gpu_bus_ids: Mapping[int, str]) -> dict[str, NicAffinity]:
        """Per NIC address (sysfs spelling), the GPUs (by index) it serves."""
        gpus = {index: place for index, bus in gpu_bus_ids.items() if (place := self.place(bus)) is not None}
        out: dict[str, NicAffinity] = {}
        for bus in nic_bus_ids:
            nic = self.place(bus)
            if nic is not None:
                out[nic.bus_id] = nearest_gpus(nic, gpus)
        return out

    def assign(self, nics: Iterable[NicReading], gpu_bus_ids: Mapping[int, str]) -> tuple[NicReading, ...]:
        """The readings with ``gpus`` filled in from the topology; a NIC that cannot be placed keeps ``()``."""
        readings = tuple(nics)
        buses = {r.pci_bus_id for r in readings if r.pci_bus_id is not None}
        found = self.affinities(sorted(buses), gpu_bus_ids)
        return tuple(
            dataclasses.replace(r, gpus=found[r.pci_bus_id].gpus) if r.pci_bus_id in found else r for r in readings
        )
