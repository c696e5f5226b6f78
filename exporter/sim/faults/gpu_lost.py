"""Fault kind ``gpu_lost``: a GPU falls off the bus (reads ``up = false`` with its identity fields only)."""

from __future__ import annotations

from gpulens.exporter.sim.faults.kind import FaultKind, GpuFaultParams
from gpulens.exporter.sim.models import GpuModel
from gpulens.exporter.sim.specs import FaultSpec
from gpulens.exporter.sim.stepstate import GpuState


class GpuLostParams(GpuFaultParams, frozen=True, tag="gpu_lost"):
    """``gpu``, ``at``, ``duration``."""


class GpuLost(FaultKind):
    name = "gpu_lost"
    params = GpuLostParams
    target = "gpu"

    def apply(self, state: GpuState, fault: FaultSpec, t: float, model: GpuModel) -> None:
        state.lost = True
