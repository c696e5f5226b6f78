"""A simulated GPU's identity and static quirks (UUID, PCI bus id, NVLink fan-out, ECC history), and the shared
context (model, jobs, faults) that shapes its signals, with the energy ledger built from it.

Everything here is fixed for the scenario's whole run and drawn from the seed, so one GPU keeps its UUID and quirks
from run to run.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from gpulens.exporter.sim import noise
from gpulens.exporter.sim.models import GpuModel
from gpulens.exporter.sim.specs import FaultSpec, GpuRef
from gpulens.exporter.sim.stepstate import Placement
from gpulens.model import LinkReading

_HGX_BUS: Final = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


class EnergyLedger:
    """Running sum of a context's nominal power, one entry per step, extended on demand (thread-safe)."""

    def __init__(self, power_at: Callable[[int], float], last_step: int, step_s: float) -> None:
        self._power_at = power_at
        self._last = last_step  # from this step on the power no longer changes
        self._step = step_s
        self._prefix = array("d", [0.0])
        self._tail_watts = power_at(last_step)
        self._lock = threading.Lock()

    def joules(self, k: int) -> float:
        """Energy from the scenario's start to the start of step ``k`` (negative before the start)."""
        if k <= 0:
            return k * self._step * self._power_at(-1)
        upto = min(k, self._last)
        with self._lock:
            prefix = self._prefix
            for i in range(len(prefix) - 1, upto):
                prefix.append(prefix[i] + self._power_at(i) * self._step)
            done = prefix[upto]
        return done + (k - upto) * self._tail_watts * self._step


@dataclass(slots=True, eq=False)
class GpuContext:
    """What shapes a GPU's nominal signals; GPUs with equal contexts share one object and one energy ledger."""

    model: GpuModel
    placements: tuple[Placement, ...]
    faults: tuple[tuple[FaultSpec, str], ...]  # with this GPU's role: "self", "job" or "node"
    ledger: EnergyLedger = dataclasses.field(init=False)


@dataclass(slots=True, eq=False)
class SimGpu:
    """A GPU's identity and its static quirks."""

    ref: GpuRef
    uuid: str
    pci_bus_id: str
    model: GpuModel
    context: GpuContext
    noise_key: bytes
    temperature_offset: float
    base_energy_joules: float
    ecc_corrected: int
    remapped_correctable: int
    pcie_replays: int
    pids: dict[str, int]
    links: tuple[tuple[int, float, str], ...]  # NVLink index, its share of the traffic, the far end's PCI bus id
    idle_links: tuple[LinkReading, ...] | None = None  # built when first needed, then reused


def make_gpu(seed: int, ref: GpuRef, model: GpuModel, context: GpuContext, pids: dict[str, int]) -> SimGpu:
    """GPU ``ref`` of a scenario with this ``seed``: its identity and quirks drawn from the seed."""
    uuid_hex = noise.key("uuid", ref.node, ref.index).hex()
    uuid = f"GPU-{uuid_hex[:8]}-{uuid_hex[8:12]}-{uuid_hex[12:16]}-{uuid_hex[16:20]}-{uuid_hex[20:32]}"
    static_key = noise.key(seed, "static", ref)
    u_static = noise.draw(static_key, 0)
    u_links = noise.draw(static_key, 1)
    weights = [1.0 + noise.spread(u_links[link], 0.04) for link in range(model.nvlink_links)]
    total = sum(weights) or 1.0
    switches = _switch_bus_ids(model)
    return SimGpu(
        ref=ref,
        uuid=uuid,
        pci_bus_id=_pci_bus_id(ref.index),
        model=model,
        context=context,
        noise_key=noise.key(seed, "gpu", ref.node, ref.index),
        temperature_offset=noise.spread(u_static[0], 2.5),
        base_energy_joules=(3 + 37 * u_static[1]) * 86400.0 * model.idle_power_watts,
        ecc_corrected=int(40 * u_static[2]) if u_static[3] < 0.1 else 0,
        remapped_correctable=1 if u_static[4] < 0.03 else 0,
        pcie_replays=int(6 * u_static[5]) if u_static[6] < 0.2 else 0,
        pids=pids,
        links=tuple((link, w / total, remote) for link, (w, remote) in enumerate(zip(weights, switches, strict=True))),
    )


@functools.cache
def _switch_bus_ids(model: GpuModel) -> tuple[str, ...]:
    """The PCI bus id of the NVSwitch at the far end of each NVLink."""
    return tuple(
        f"00000000:{0x05 + link * model.nvswitches // model.nvlink_links:02X}:00.0"
        for link in range(model.nvlink_links)
    )


def _pci_bus_id(index: int) -> str:
    """An HGX board's bus ids for the first eight GPUs; devices on one extra bus beyond."""
    if index < len(_HGX_BUS):
        return f"00000000:{_HGX_BUS[index]:02X}:00.0"
    return f"00000000:{0xE0 + index // 32:02X}:{index % 32:02X}.0"
