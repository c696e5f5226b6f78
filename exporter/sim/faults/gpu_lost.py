"""Fault kind ``gpu_lost``: a GPU falls off the bus (reads ``up = false`` with its identity fields only)."""

from __future__ import annotations

from exporter.sim.models import GpuModel
from exporter.sim.specs import FaultSpec
from exporter.sim.stepstate import GpuState

from .kind import FaultKind, GpuFaultParams


class GpuLostParams(GpuFaultParams, frozen=True, tag="gpu_lost"):
    """``gpu``, ``at``, ``duration``."""


class GpuLost(FaultKind):
    name = "gpu_lost"
    params = GpuLostParams
    target = "gpu"

    def apply(self, state: GpuState, fault: FaultSpec, t: float, model: GpuModel) -> None:
        state.lost = True
