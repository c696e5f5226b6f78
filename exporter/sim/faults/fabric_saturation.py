"""Fault kind ``fabric_saturation``: a training job spanning nodes runs back-to-back all-reduce at the fabric's
line rate: every port next to its GPUs moves 91-97 % of its rate in both directions.

Not a failure of the fabric but the load that drives ``FabricBandwidthSaturated``: the job is communication-bound.
Its GPUs stay busy (utilization ~0.97) with most of each step in all-reduce (low tensor activity).
"""

from __future__ import annotations

from typing import Final

from gpulens.exporter.sim.faults.kind import FaultKind, JobFaultParams, ScenarioView, require_multi_node_training
from gpulens.exporter.sim.specs import FaultSpec, JobSpec
from gpulens.exporter.sim.stepstate import RUN, JobPhase

SATURATED_COMM_FRACTION: Final = 0.96  # of each step spent in all-reduce
SATURATED_PACE: Final = 4.0  # the job asks for four times its usual traffic: more than any port can carry


class FabricSaturationParams(JobFaultParams, frozen=True, tag="fabric_saturation"):
    """``job``, ``at``, ``duration``."""


class FabricSaturation(FaultKind):
    name = "fabric_saturation"
    params = FabricSaturationParams
    target = "job"
    fabric = True
    job_bound = True
    phase_priority = 10

    def check(self, fault: FaultSpec, job: JobSpec | None, scenario: ScenarioView) -> None:
        require_multi_node_training(self, job)

    def job_phase(self, fault: FaultSpec) -> JobPhase:
        return JobPhase(RUN, comm_fraction=SATURATED_COMM_FRACTION)

    def fabric_pace(self, fault: FaultSpec, t: float) -> float:
        return SATURATED_PACE
