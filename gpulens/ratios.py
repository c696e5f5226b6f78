"""Derived ratios: one function per ratio that is computed from two readings' fields.

Each takes plain values (so storage rows, rollups and records can all use it) and returns a 0-1 ratio, or ``None``
when either side is unknown or the ceiling is zero. ``*_of`` helpers apply them to a :class:`GpuReading`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpulens.hardware import nvlink_max_bytes_per_second, pcie_max_bytes_per_second
from gpulens.model import GpuReading


def share(value: float | None, ceiling: float | None) -> float | None:
    """``value / ceiling``, or ``None`` when either is unknown or the ceiling is not positive."""
    if value is None or ceiling is None or ceiling <= 0:
        return None
    return value / ceiling


def memory_used_ratio(used_bytes: float | None, total_bytes: float | None) -> float | None:
    """Memory used as a share of the GPU's total memory."""
    return share(used_bytes, total_bytes)


def power_limit_ratio(power_watts: float | None, limit_watts: float | None) -> float | None:
    """Power draw as a share of the enforced power limit."""
    return share(power_watts, limit_watts)


def busiest_direction(tx: float | None, rx: float | None) -> float | None:
    """The larger of two directions' rates, or the one that is known."""
    present = [v for v in (tx, rx) if v is not None]
    return max(present) if present else None


def pcie_utilization_ratio(r: GpuReading) -> float | None:
    """The busier PCIe direction as a share of the current link's ceiling (generation and width now)."""
    ceiling = pcie_max_bytes_per_second(r.pcie_link_generation, r.pcie_link_width)
    return share(busiest_direction(r.pcie_tx_bytes_per_second, r.pcie_rx_bytes_per_second), ceiling)


def nvlink_utilization_ratio(r: GpuReading) -> float | None:
    """The busier NVLink direction as a share of the active links' ceiling."""
    ceiling = nvlink_max_bytes_per_second(r.nvlink_links_active)
    return share(busiest_direction(r.nvlink_tx_bytes_per_second, r.nvlink_rx_bytes_per_second), ceiling)


def memory_used_ratio_of(r: GpuReading) -> float | None:
    return memory_used_ratio(r.memory_used_bytes, r.memory_total_bytes)


def power_limit_ratio_of(r: GpuReading) -> float | None:
    return power_limit_ratio(r.power_watts, r.power_limit_watts)


@dataclass(frozen=True, slots=True)
class LinkLoad:
    """One GPU's busier PCIe and NVLink directions as shares of their links' ceilings (0 where unknown or without
    NVLink): what the interconnect page plots of every GPU."""

    node: str
    gpu: int
    uuid: str
    pcie_ratio: float
    nvlink_ratio: float


def link_loads(readings: Iterable[GpuReading]) -> list[LinkLoad]:
    """The link loads of every GPU up that reports a PCIe link or NVLinks."""
    out = []
    for r in readings:
        if not r.up or (r.pcie_link_generation is None and r.nvlink_links_active is None):
            continue
        nvlink = (nvlink_utilization_ratio(r) or 0.0) if r.nvlink_links_active else 0.0
        out.append(LinkLoad(r.node, r.gpu, r.uuid, pcie_utilization_ratio(r) or 0.0, nvlink))
    return out
