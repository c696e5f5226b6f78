"""Fault kind ``nvlink_saturation``: a training job runs back-to-back all-reduce near the NVLink ceiling."""

from __future__ import annotations

from typing import Final

from gpulens.exporter.sim.faults.kind import (
    FaultCheckError,
    FaultKind,
    JobFaultParams,
    ScenarioView,
    require_multi_gpu_training,
)
from gpulens.exporter.sim.specs import FaultSpec, JobSpec
from gpulens.exporter.sim.stepstate import RUN, JobPhase, Levels

SATURATED_COMM_FRACTION: Final = 0.96  # of each step spent in all-reduce
SATURATED_ALL_REDUCE: Final[Levels] = (0.12, 0.02, 0.25, 0.50)  # sm, tensor, dram, power load
SATURATED_LINK_SHARE: Final = 0.98  # of the NVLink ceiling while in all-reduce


class NvlinkSaturationParams(JobFaultParams, frozen=True, tag="nvlink_saturation"):
    """``job``, ``at``, ``duration``."""


class NvlinkSaturation(FaultKind):
    name = "nvlink_saturation"
    params = NvlinkSaturationParams
    target = "job"
    job_bound = True
    phase_priority = 5

    def check(self, fault: FaultSpec, job: JobSpec | None, scenario: ScenarioView) -> None:
        require_multi_gpu_training(self, job)
        assert job is not None
        per_node: dict[str, int] = {}
        for g in job.gpus:
            if scenario.nodes[g.node].model.has_nvlink:
                per_node[g.node] = per_node.get(g.node, 0) + 1
        if max(per_node.values(), default=0) < 2:
            raise FaultCheckError(self.target, "nvlink_saturation needs 2 or more of the job's GPUs on one NVLink node")

    def job_phase(self, fault: FaultSpec) -> JobPhase:
        return JobPhase(
            RUN,
            comm_fraction=SATURATED_COMM_FRACTION,
            all_reduce=SATURATED_ALL_REDUCE,
            link_share=SATURATED_LINK_SHARE,
        )
