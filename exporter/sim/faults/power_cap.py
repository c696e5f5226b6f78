"""Fault kind ``power_cap``: a GPU's enforced power limit is lowered below its board power."""

from __future__ import annotations

from typing import Final

from gpulens.exporter.sim.faults.kind import FaultKind, GpuFaultParams
from gpulens.exporter.sim.models import GpuModel
from gpulens.exporter.sim.specs import FaultSpec
from gpulens.exporter.sim.stepstate import GpuState

POWER_CAP_SHARE: Final = 0.5  # the enforced limit, as a share of board power


class PowerCapParams(GpuFaultParams, frozen=True, tag="power_cap"):
    """``gpu``, ``at``, ``duration``."""


class PowerCap(FaultKind):
    """The engine clamps power to the limit and sets ``sw_power_cap`` while the work asks for more."""

    name = "power_cap"
    params = PowerCapParams
    target = "gpu"

    def apply(self, state: GpuState, fault: FaultSpec, t: float, model: GpuModel) -> None:
        state.power_limit_watts = POWER_CAP_SHARE * model.board_power_watts
