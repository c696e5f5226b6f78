"""The simulator's GPU model catalogue (datasheet ceilings from DOMAIN.md section 1, plus typical NVML values).

Datasheet figures (memory, NVLink, PCIe, board power) are ceilings. The other figures (idle power, clocks,
temperatures, reserved memory) are typical of what NVML reports on such a GPU; they make the simulation look real,
they are not measurements.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

_MIB: Final = 1024 * 1024
_MHZ: Final = 1_000_000.0

# PCIe payload rate per lane per direction (bytes/s), by generation.
PCIE_LANE_BYTES_PER_SECOND: Final[Mapping[int, float]] = {
    1: 0.25e9,
    2: 0.5e9,
    3: 0.985e9,
    4: 1.969e9,
    5: 3.938e9,
}


def pcie_max_bytes_per_second(generation: int, width: int) -> float:
    """Payload ceiling of a PCIe link in one direction."""
    return PCIE_LANE_BYTES_PER_SECOND[generation] * width


@dataclass(frozen=True, slots=True)
class GpuModel:
    """One GPU model of the catalogue."""

    name: str  # the catalogue name used in scenario files, e.g. "H100-SXM5-80GB"
    product_name: str  # what NVML's nvmlDeviceGetName reports, e.g. "NVIDIA H100 80GB HBM3"
    memory_total_bytes: int
    memory_reserved_bytes: int
    memory_bandwidth_bytes_per_second: float
    nvlink_generation: int | None
    nvlink_links: int  # 0: PCIe-only, no NVLink
    nvlink_link_bytes_per_second: float  # per link, per direction
    nvswitches: int  # NVSwitch chips the links fan out to (0 without NVLink)
    pcie_generation: int
    pcie_width: int
    board_power_watts: float
    idle_power_watts: float
    max_sm_clock_hertz: float
    idle_sm_clock_hertz: float
    max_memory_clock_hertz: float
    idle_memory_clock_hertz: float
    slowdown_temperature_celsius: float
    idle_temperature_celsius: float
    load_temperature_celsius: float  # at board power, with healthy cooling
    memory_temperature_offset_celsius: float | None  # None: the memory sensor is not readable (GDDR boards)

    @property
    def has_nvlink(self) -> bool:
        return self.nvlink_links > 0

    @property
    def nvlink_max_bytes_per_second(self) -> float:
        """All links together, one direction."""
        return self.nvlink_links * self.nvlink_link_bytes_per_second

    @property
    def pcie_max_bytes_per_second(self) -> float:
        """The healthy link's ceiling, one direction."""
        return pcie_max_bytes_per_second(self.pcie_generation, self.pcie_width)


CATALOGUE: Final[Mapping[str, GpuModel]] = {
    m.name: m
    for m in (
        GpuModel(
            name="A100-SXM4-80GB",
            product_name="NVIDIA A100-SXM4-80GB",
            memory_total_bytes=81920 * _MIB,
            memory_reserved_bytes=613 * _MIB,
            memory_bandwidth_bytes_per_second=2.0e12,
            nvlink_generation=3,
            nvlink_links=12,
            nvlink_link_bytes_per_second=25e9,
            nvswitches=6,
            pcie_generation=4,
            pcie_width=16,
            board_power_watts=400.0,
            idle_power_watts=55.0,
            max_sm_clock_hertz=1410 * _MHZ,
            idle_sm_clock_hertz=210 * _MHZ,
            max_memory_clock_hertz=1593 * _MHZ,
            idle_memory_clock_hertz=1593 * _MHZ,
            slowdown_temperature_celsius=89.0,
            idle_temperature_celsius=31.0,
            load_temperature_celsius=68.0,
            memory_temperature_offset_celsius=4.0,
        ),
        GpuModel(
            name="H100-SXM5-80GB",
            product_name="NVIDIA H100 80GB HBM3",
            memory_total_bytes=81559 * _MIB,
            memory_reserved_bytes=583 * _MIB,
            memory_bandwidth_bytes_per_second=3.35e12,
            nvlink_generation=4,
            nvlink_links=18,
            nvlink_link_bytes_per_second=25e9,
            nvswitches=4,
            pcie_generation=5,
            pcie_width=16,
            board_power_watts=700.0,
            idle_power_watts=70.0,
            max_sm_clock_hertz=1980 * _MHZ,
            idle_sm_clock_hertz=345 * _MHZ,
            max_memory_clock_hertz=2619 * _MHZ,
            idle_memory_clock_hertz=2619 * _MHZ,
            slowdown_temperature_celsius=90.0,
            idle_temperature_celsius=32.0,
            load_temperature_celsius=72.0,
            memory_temperature_offset_celsius=6.0,
        ),
        GpuModel(
            name="H200-SXM-141GB",
            product_name="NVIDIA H200",
            memory_total_bytes=143771 * _MIB,
            memory_reserved_bytes=603 * _MIB,
            memory_bandwidth_bytes_per_second=4.8e12,
            nvlink_generation=4,
            nvlink_links=18,
            nvlink_link_bytes_per_second=25e9,
            nvswitches=4,
            pcie_generation=5,
            pcie_width=16,
            board_power_watts=700.0,
            idle_power_watts=75.0,
            max_sm_clock_hertz=1980 * _MHZ,
            idle_sm_clock_hertz=345 * _MHZ,
            max_memory_clock_hertz=3201 * _MHZ,
            idle_memory_clock_hertz=3201 * _MHZ,
            slowdown_temperature_celsius=90.0,
            idle_temperature_celsius=33.0,
            load_temperature_celsius=73.0,
            memory_temperature_offset_celsius=6.0,
        ),
        GpuModel(
            name="L40S",
            product_name="NVIDIA L40S",
            memory_total_bytes=46068 * _MIB,
            memory_reserved_bytes=587 * _MIB,
            memory_bandwidth_bytes_per_second=0.864e12,
            nvlink_generation=None,
            nvlink_links=0,
            nvlink_link_bytes_per_second=0.0,
            nvswitches=0,
            pcie_generation=4,
            pcie_width=16,
            board_power_watts=350.0,
            idle_power_watts=32.0,
            max_sm_clock_hertz=2520 * _MHZ,
            idle_sm_clock_hertz=210 * _MHZ,
            max_memory_clock_hertz=9001 * _MHZ,
            idle_memory_clock_hertz=405 * _MHZ,
            slowdown_temperature_celsius=91.0,
            idle_temperature_celsius=30.0,
            load_temperature_celsius=76.0,
            memory_temperature_offset_celsius=None,
        ),
    )
}


def find_model(name: str) -> GpuModel | None:
    """The catalogue entry for a catalogue name (``H100-SXM5-80GB``) or an NVML product name, else ``None``."""
    model = CATALOGUE.get(name)
    if model is not None:
        return model
    return next((m for m in CATALOGUE.values() if m.product_name == name), None)
