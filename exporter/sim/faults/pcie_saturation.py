"""Fault kind ``pcie_saturation``: a GPU's PCIe link runs near its ceiling in both directions."""

from __future__ import annotations

from typing import Final

from exporter.sim.models import GpuModel
from exporter.sim.specs import FaultSpec
from exporter.sim.stepstate import GpuState

from .kind import FaultKind, GpuFaultParams

PCIE_SATURATION_SHARE: Final = 0.94  # of the current link's ceiling, each direction


class PcieSaturationParams(GpuFaultParams, frozen=True, tag="pcie_saturation"):
    """``gpu``, ``at``, ``duration``."""


class PcieSaturation(FaultKind):
    name = "pcie_saturation"
    params = PcieSaturationParams
    target = "gpu"

    def apply(self, state: GpuState, fault: FaultSpec, t: float, model: GpuModel) -> None:
        state.activity.pcie_tx = state.activity.pcie_rx = PCIE_SATURATION_SHARE
