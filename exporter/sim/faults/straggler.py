"""Fault kind ``straggler``: one slow rank (a warm, clock-limited GPU) holds its whole training job back.

The slow GPU computes all the time at ~68% of its max SM clock with ``sw_thermal`` set, a few degrees under the
slowdown threshold; the job's other ranks spend part of each step spinning in the collective, waiting for it, and
every iteration is stretched, so the job moves less data.
"""

from __future__ import annotations

from typing import Final

from gpulens.exporter.sim.clockevents import SW_THERMAL
from gpulens.exporter.sim.faults.kind import FaultKind, GpuFaultParams, ScenarioView, require_multi_gpu_training
from gpulens.exporter.sim.models import GpuModel
from gpulens.exporter.sim.specs import FaultSpec, JobSpec
from gpulens.exporter.sim.stepstate import GpuState, RankShare

STRAGGLER_CLOCK_SHARE: Final = 0.68
STRAGGLER_SLOWDOWN: Final = 0.7  # the straggler's speed relative to a healthy rank
PEER_WAIT_SHARE: Final = 0.3  # of each step, while a straggler holds the job back
STRAGGLER_LOAD_FACTOR: Final = 0.8  # computing all the time, at a lower clock


class StragglerParams(GpuFaultParams, frozen=True, tag="straggler"):
    """``gpu``, ``at``, ``duration``."""


class Straggler(FaultKind):
    name = "straggler"
    params = StragglerParams
    target = "gpu"
    job_bound = True
    shapes_ranks = True

    def check(self, fault: FaultSpec, job: JobSpec | None, scenario: ScenarioView) -> None:
        require_multi_gpu_training(self, job)

    def rank_share(self, on_target: bool, comm_fraction: float) -> RankShare:
        if on_target:  # the slow rank never waits: the others wait for it
            return RankShare(0.97, 0.03, 0.0, load_factor=STRAGGLER_LOAD_FACTOR, pace=STRAGGLER_SLOWDOWN)
        comm = comm_fraction * STRAGGLER_SLOWDOWN
        return RankShare(1.0 - comm - PEER_WAIT_SHARE, comm, PEER_WAIT_SHARE, pace=STRAGGLER_SLOWDOWN)

    def apply(self, state: GpuState, fault: FaultSpec, t: float, model: GpuModel) -> None:
        state.throttle |= SW_THERMAL
        state.clock_share = min(state.clock_share, STRAGGLER_CLOCK_SHARE)
        if state.heat != "hot":
            state.heat = "warm"
