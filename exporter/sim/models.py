"""The simulator's GPU model catalogue: the datasheet facts of ``gpulens.hardware`` plus typical NVML values.

Datasheet figures (memory bandwidth, NVLink, PCIe, board power, maximum SM clock) are ceilings and, with the
slowdown temperature, are read from :data:`gpulens.hardware.GPU_MODELS`; nothing here writes one down again. The
other figures (memory as NVML reports it, idle power, idle clocks, temperatures, reserved memory, NVSwitch count) are
typical of what NVML shows on such a GPU; they make the simulation look real, they are not measurements
(docs/domain.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from gpulens.hardware import GPU_MODELS, GpuModelFacts

_MIB: Final = 1024 * 1024
_MHZ: Final = 1_000_000.0


@dataclass(frozen=True, slots=True)
class GpuModel:
    """One GPU model of the catalogue: its datasheet ``facts`` and the values a simulated one reports."""

    facts: GpuModelFacts
    memory_total_bytes: int
    memory_reserved_bytes: int
    nvswitches: int  # NVSwitch chips the links fan out to (0 without NVLink)
    idle_power_watts: float
    idle_sm_clock_hertz: float
    max_memory_clock_hertz: float
    idle_memory_clock_hertz: float
    idle_temperature_celsius: float
    load_temperature_celsius: float  # at board power, with healthy cooling
    memory_temperature_offset_celsius: float | None  # None: the memory sensor is not readable (GDDR boards)

    @property
    def name(self) -> str:
        """The catalogue name used in scenario files, e.g. ``H100-SXM5-80GB``."""
        return self.facts.name

    @property
    def product_name(self) -> str:
        """What NVML's nvmlDeviceGetName reports, e.g. ``NVIDIA H100 80GB HBM3``."""
        return self.facts.product_name

    @property
    def memory_bandwidth_bytes_per_second(self) -> float:
        return self.facts.memory_bandwidth_bytes_per_second

    @property
    def board_power_watts(self) -> float:
        return self.facts.board_power_watts

    @property
    def max_sm_clock_hertz(self) -> float:
        return self.facts.max_sm_clock_hertz

    @property
    def slowdown_temperature_celsius(self) -> float:
        return self.facts.slowdown_temperature_celsius

    @property
    def nvlink_generation(self) -> int | None:
        return self.facts.nvlink_generation

    @property
    def nvlink_links(self) -> int:
        """0: PCIe-only, no NVLink."""
        return self.facts.nvlink_links

    @property
    def has_nvlink(self) -> bool:
        return self.facts.nvlink_links > 0

    @property
    def nvlink_link_bytes_per_second(self) -> float:
        """Per link, per direction (0 without NVLink)."""
        return self.facts.nvlink_link_bytes_per_second

    @property
    def nvlink_max_bytes_per_second(self) -> float:
        """All links together, one direction."""
        return self.facts.nvlink_max_bytes_per_second

    @property
    def pcie_generation(self) -> int:
        return self.facts.pcie_generation

    @property
    def pcie_width(self) -> int:
        return self.facts.pcie_width

    @property
    def pcie_max_bytes_per_second(self) -> float:
        """The healthy link's ceiling, one direction."""
        return self.facts.pcie_max_bytes_per_second


CATALOGUE: Final[Mapping[str, GpuModel]] = {
    m.name: m
    for m in (
        GpuModel(
            facts=GPU_MODELS["A100-SXM4-80GB"],
            memory_total_bytes=81920 * _MIB,
            memory_reserved_bytes=613 * _MIB,
            nvswitches=6,
            idle_power_watts=55.0,
            idle_sm_clock_hertz=210 * _MHZ,
            max_memory_clock_hertz=1593 * _MHZ,
            idle_memory_clock_hertz=1593 * _MHZ,
            idle_temperature_celsius=31.0,
            load_temperature_celsius=68.0,
            memory_temperature_offset_celsius=4.0,
        ),
        GpuModel(
            facts=GPU_MODELS["H100-SXM5-80GB"],
            memory_total_bytes=81559 * _MIB,
            memory_reserved_bytes=583 * _MIB,
            nvswitches=4,
            idle_power_watts=70.0,
            idle_sm_clock_hertz=345 * _MHZ,
            max_memory_clock_hertz=2619 * _MHZ,
            idle_memory_clock_hertz=2619 * _MHZ,
            idle_temperature_celsius=32.0,
            load_temperature_celsius=72.0,
            memory_temperature_offset_celsius=6.0,
        ),
        GpuModel(
            facts=GPU_MODELS["H200-SXM-141GB"],
            memory_total_bytes=143771 * _MIB,
            memory_reserved_bytes=603 * _MIB,
            nvswitches=4,
            idle_power_watts=75.0,
            idle_sm_clock_hertz=345 * _MHZ,
            max_memory_clock_hertz=3201 * _MHZ,
            idle_memory_clock_hertz=3201 * _MHZ,
            idle_temperature_celsius=33.0,
            load_temperature_celsius=73.0,
            memory_temperature_offset_celsius=6.0,
        ),
        GpuModel(
            facts=GPU_MODELS["L40S"],
            memory_total_bytes=46068 * _MIB,
            memory_reserved_bytes=587 * _MIB,
            nvswitches=0,
            idle_power_watts=32.0,
            idle_sm_clock_hertz=210 * _MHZ,
            max_memory_clock_hertz=9001 * _MHZ,
            idle_memory_clock_hertz=405 * _MHZ,
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
