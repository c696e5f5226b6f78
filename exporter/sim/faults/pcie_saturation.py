"""Fault kind ``pcie_saturation``: a GPU's PCIe link runs near its ceiling in both directions."""

from __future__ import annotations

from typing import Final

from gpulens.exporter.sim.faults.kind import FaultKind, GpuFaultParams
from gpulens.exporter.sim.models import GpuModel
from gpulens.exporter.sim.specs import FaultSpec
from gpulens.exporter.sim.stepstate import GpuState

PCIE_SATURATION_SHARE: Final = 0.94  # of the current link's ceiling, each direction


class PcieSaturationParams(GpuFaultParams, frozen=True, tag="pcie_saturation"):
    """``gpu``, ``at``, ``duration``."""


class PcieSaturation(FaultKind):
    name = "pcie_saturation"
    params = PcieSaturationParams
    target = "gpu"

    def apply(self, state: GpuState, fault: FaultSpec, t: float, model: GpuModel) -> None:
        state.activity.pcie_tx = state.activity.pcie_rx = PCIE_SATURATION_SHARE
