"""Fault kind ``pcie_degraded``: a GPU's PCIe link trains below its maximum and replays climb."""

from __future__ import annotations

from typing import Final

from gpulens.exporter.sim.faults.kind import FaultKind, GpuFaultParams
from gpulens.exporter.sim.models import GpuModel
from gpulens.exporter.sim.specs import FaultSpec
from gpulens.exporter.sim.stepstate import Counters, GpuState

DEGRADED_PCIE_GENERATION: Final = 3  # Gen2 on a board whose maximum is Gen3
DEGRADED_PCIE_WIDTH: Final = 8
DEGRADED_PCIE_REPLAYS_PER_S: Final = 1.5


class PcieDegradedParams(GpuFaultParams, frozen=True, tag="pcie_degraded"):
    """``gpu``, ``at``, ``duration``."""


class PcieDegraded(FaultKind):
    name = "pcie_degraded"
    params = PcieDegradedParams
    target = "gpu"

    def apply(self, state: GpuState, fault: FaultSpec, t: float, model: GpuModel) -> None:
        generation = model.pcie_generation
        state.pcie_generation = DEGRADED_PCIE_GENERATION if generation > DEGRADED_PCIE_GENERATION else generation - 1
        state.pcie_width = DEGRADED_PCIE_WIDTH

    def count(self, fault: FaultSpec, elapsed_s: float, counters: Counters) -> None:
        counters.pcie_replays += int(DEGRADED_PCIE_REPLAYS_PER_S * elapsed_s)
