"""Hardware ceilings: the one table of link rates and GPU model facts that every layer reads.

PCIe payload rates per lane, NVLink per-link rates by generation, and the datasheet figures of the GPU models the
simulator knows. Datasheet values are ceilings, not measurements (docs/domain.md explains where each comes from).
The simulator, the alert rules, the Prometheus rule export and the dashboard all import these; nothing else may
write a link rate down.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

# PCIe payload rate per lane and direction, bytes/s, by generation: the line rate less the encoding overhead
# (8b/10b for Gen 1-2, 128b/130b for Gen 3-5, FLIT mode for Gen 6).
PCIE_LANE_BYTES_PER_SECOND: Final[Mapping[int, float]] = {
    1: 0.25e9,
    2: 0.5e9,
    3: 0.985e9,
    4: 1.969e9,
    5: 3.938e9,
    6: 7.563e9,
}

# NVLink payload rate per link and direction, bytes/s, by NVLink generation (P100: 1, V100: 2, A100: 3,
# H100/H200: 4, B200: 5).
NVLINK_LINK_BYTES_PER_SECOND: Final[Mapping[int, float]] = {
    1: 20e9,
    2: 25e9,
    3: 25e9,
    4: 25e9,
    5: 50e9,
}
# Used where a reading does not say its generation: generations 2 to 4, every GPU this project has been run on.
NVLINK_DEFAULT_LINK_BYTES_PER_SECOND: Final = 25e9


def pcie_max_bytes_per_second(generation: int | None, width: int | None) -> float | None:
    """The payload ceiling of a PCIe link in one direction; ``None`` when the generation or width is unknown."""
    if generation is None or width is None or width <= 0:
        return None
    lane = PCIE_LANE_BYTES_PER_SECOND.get(generation)
    return None if lane is None else lane * width


def nvlink_link_bytes_per_second(generation: int | None = None) -> float:
    """The per-direction payload rate of one NVLink of this generation (the common rate when unknown)."""
    if generation is None:
        return NVLINK_DEFAULT_LINK_BYTES_PER_SECOND
    return NVLINK_LINK_BYTES_PER_SECOND.get(generation, NVLINK_DEFAULT_LINK_BYTES_PER_SECOND)


def nvlink_max_bytes_per_second(links_active: int | None, generation: int | None = None) -> float | None:
    """The per-direction NVLink ceiling of a GPU with this many active links; ``None`` without NVLink."""
    if not links_active:
        return None
    return links_active * nvlink_link_bytes_per_second(generation)


@dataclass(frozen=True, slots=True)
class GpuModelFacts:
    """The datasheet ceilings of one GPU model."""

    name: str  # the catalogue name used in scenario files, e.g. "H100-SXM5-80GB"
    product_name: str  # what NVML's nvmlDeviceGetName reports, e.g. "NVIDIA H100 80GB HBM3"
    memory_bandwidth_bytes_per_second: float
    nvlink_generation: int | None
    nvlink_links: int  # 0: PCIe-only
    pcie_generation: int
    pcie_width: int
    board_power_watts: float
    max_sm_clock_hertz: float  # the boost clock, what NVML reports as the maximum SM clock
    # Where the driver starts slowing the GPU down to cool it, as NVML reports it on these boards (typical, not a
    # datasheet figure): read by the throttle inference when a dcgm-exporter page does not say (gpulens.dcgmthrottle).
    slowdown_temperature_celsius: float

    @property
    def nvlink_link_bytes_per_second(self) -> float:
        return nvlink_link_bytes_per_second(self.nvlink_generation) if self.nvlink_links else 0.0

    @property
    def nvlink_max_bytes_per_second(self) -> float:
        """All links together, one direction (0 without NVLink)."""
        return nvlink_max_bytes_per_second(self.nvlink_links, self.nvlink_generation) or 0.0

    @property
    def pcie_max_bytes_per_second(self) -> float:
        """The healthy link's ceiling, one direction."""
        ceiling = pcie_max_bytes_per_second(self.pcie_generation, self.pcie_width)
        assert ceiling is not None  # every catalogue entry names a known generation
        return ceiling


GPU_MODELS: Final[Mapping[str, GpuModelFacts]] = {
    m.name: m
    for m in (
        GpuModelFacts("A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", 2.0e12, 3, 12, 4, 16, 400.0, 1410e6, 89.0),
        GpuModelFacts("H100-SXM5-80GB", "NVIDIA H100 80GB HBM3", 3.35e12, 4, 18, 5, 16, 700.0, 1980e6, 90.0),
        GpuModelFacts("H200-SXM-141GB", "NVIDIA H200", 4.8e12, 4, 18, 5, 16, 700.0, 1980e6, 90.0),
        GpuModelFacts("L40S", "NVIDIA L40S", 0.864e12, None, 0, 4, 16, 350.0, 2520e6, 91.0),
    )
}


def find_gpu_model(name: str) -> GpuModelFacts | None:
    """The facts for a catalogue name (``H100-SXM5-80GB``) or an NVML product name, else ``None``."""
    model = GPU_MODELS.get(name)
    if model is not None:
        return model
    return next((m for m in GPU_MODELS.values() if m.product_name == name), None)
