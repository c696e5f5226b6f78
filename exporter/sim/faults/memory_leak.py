"""Fault kind ``memory_leak``: a GPU's used memory climbs from its job's level to nearly all of it."""

from __future__ import annotations

from typing import Final

from gpulens.exporter.sim.faults.kind import FaultKind, GpuFaultParams
from gpulens.exporter.sim.models import GpuModel
from gpulens.exporter.sim.specs import FaultSpec
from gpulens.exporter.sim.stepstate import GpuState

LEAK_TARGET_SHARE: Final = 0.985  # memory_leak ends its window with this share of total memory used


class MemoryLeakParams(GpuFaultParams, frozen=True, tag="memory_leak"):
    """``gpu``, ``at``, ``duration``."""


def leaked(fault: FaultSpec, t: float, base: float, model: GpuModel) -> float:
    """Memory share during a leak: climbs from the job's level to ``LEAK_TARGET_SHARE`` over 90% of the window."""
    usable = (model.memory_total_bytes - model.memory_reserved_bytes) / model.memory_total_bytes - 0.002
    target = max(base, min(LEAK_TARGET_SHARE, usable))
    progress = min(1.0, (t - fault.start) / (0.9 * (fault.end - fault.start)))
    return base + (target - base) * progress


class MemoryLeak(FaultKind):
    name = "memory_leak"
    params = MemoryLeakParams
    target = "gpu"

    def apply(self, state: GpuState, fault: FaultSpec, t: float, model: GpuModel) -> None:
        state.activity.memory_fraction = leaked(fault, t, state.activity.memory_fraction, model)
