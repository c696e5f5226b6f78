"""Fault kind ``rank_dead``: one rank's process of a training job dies (``gpu``: the GPU it ran on).

Its GPU falls idle with its memory freed; the job's other ranks spin in the collective the dead rank never joins
(as ``hang_spinning``). NCCL RAS reports the dead rank's process unresponsive about 5 s after it dies and considered
dead after 60 s (``RAS_UNRESPONSIVE_S``, ``RAS_DEAD_S``), while the others show one more launched operation.
"""

from __future__ import annotations

from typing import Final

from gpulens.exporter.sim.clockevents import IDLE
from gpulens.exporter.sim.faults.comm_stall import spinning
from gpulens.exporter.sim.faults.kind import FaultKind, GpuFaultParams, ScenarioView, require_multi_gpu_training
from gpulens.exporter.sim.models import GpuModel
from gpulens.exporter.sim.specs import FaultSpec, JobSpec
from gpulens.exporter.sim.stepstate import STALL, GpuState, JobPhase, idle_activity

RAS_UNRESPONSIVE_S: Final = 5.0
RAS_DEAD_S: Final = 60.0


class RankDeadParams(GpuFaultParams, frozen=True, tag="rank_dead"):
    """``gpu``, ``at``, ``duration`` (default: until the job ends)."""


class RankDead(FaultKind):
    name = "rank_dead"
    params = RankDeadParams
    target = "gpu"
    job_bound = True
    phase_priority = 11

    def check(self, fault: FaultSpec, job: JobSpec | None, scenario: ScenarioView) -> None:
        require_multi_gpu_training(self, job)

    def job_phase(self, fault: FaultSpec) -> JobPhase:
        return JobPhase(STALL, activity=spinning)

    def apply(self, state: GpuState, fault: FaultSpec, t: float, model: GpuModel) -> None:
        """The dead rank's GPU: nothing runs and its memory is freed."""
        state.activity = idle_activity(0.0)
        state.load = state.activity.load
        state.throttle |= IDLE
