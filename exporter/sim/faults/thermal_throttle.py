"""Fault kind ``thermal_throttle``: a GPU runs above its slowdown temperature, thermally throttled."""

from __future__ import annotations

from typing import Final

from gpulens.exporter.sim.clockevents import THERMAL
from gpulens.exporter.sim.faults.kind import FaultKind, GpuFaultParams
from gpulens.exporter.sim.models import GpuModel
from gpulens.exporter.sim.specs import FaultSpec
from gpulens.exporter.sim.stepstate import GpuState

THERMAL_CLOCK_SHARE: Final = 0.55
THERMAL_LOAD_FACTOR: Final = 0.65


class ThermalThrottleParams(GpuFaultParams, frozen=True, tag="thermal_throttle"):
    """``gpu``, ``at``, ``duration``."""


class ThermalThrottle(FaultKind):
    name = "thermal_throttle"
    params = ThermalThrottleParams
    target = "gpu"

    def apply(self, state: GpuState, fault: FaultSpec, t: float, model: GpuModel) -> None:
        state.throttle |= THERMAL
        state.clock_share = min(state.clock_share, THERMAL_CLOCK_SHARE)
        state.load *= THERMAL_LOAD_FACTOR
        state.heat = "hot"
