"""Fault kind ``hang_mixed``: some ranks of a training job spin in a collective while the others (``ranks``) are
blocked on the host.

The job's GPUs outside ``ranks`` look like ``hang_spinning`` (~1.0 utilization, clocks up, power about idle); the
GPUs of ``ranks`` look like ``hang_blocked`` (0 utilization, idle clocks, idle power). On every GPU NVLink and PCIe
traffic fall to ~0 and memory stays held and exactly flat.
"""

from __future__ import annotations

from typing import Any

from gpulens.exporter.sim.clockevents import IDLE
from gpulens.exporter.sim.faults.comm_stall import spinning
from gpulens.exporter.sim.faults.hang_blocked import blocked
from gpulens.exporter.sim.faults.kind import (
    FaultCheckError,
    FaultKind,
    JobFaultParams,
    ScenarioView,
    require_multi_gpu_training,
)
from gpulens.exporter.sim.models import GpuModel
from gpulens.exporter.sim.specs import FaultSpec, JobSpec
from gpulens.exporter.sim.stepstate import STALL, GpuState, JobPhase


class HangMixedParams(JobFaultParams, frozen=True, tag="hang_mixed", kw_only=True):
    """``job``, ``at``, ``duration``, ``ranks``: a list of GPU ranges, the job's GPUs that fall idle."""

    ranks: str | list[str]
    stuck_ranks: str | list[str] | None = None


class HangMixed(FaultKind):
    name = "hang_mixed"
    params = HangMixedParams
    target = "job"
    job_bound = True
    phase_priority = 3

    def ranks(self, params: Any) -> str | list[str] | None:
        assert isinstance(params, HangMixedParams)
        return params.ranks

    def check(self, fault: FaultSpec, job: JobSpec | None, scenario: ScenarioView) -> None:
        require_multi_gpu_training(self, job)
        if job is None:
            return
        outside = [str(ref) for ref in fault.ranks if ref not in job.gpus]
        if outside:
            raise FaultCheckError("ranks", f"GPU {outside[0]} is not one of job {job.id!r}'s GPUs")
        if len(fault.ranks) >= len(job.gpus):
            raise FaultCheckError("ranks", "names every GPU of the job: some ranks must keep spinning")

    def job_phase(self, fault: FaultSpec) -> JobPhase:
        return JobPhase(STALL, activity=spinning)

    def apply(self, state: GpuState, fault: FaultSpec, t: float, model: GpuModel) -> None:
        """A GPU of ``ranks`` (its role is "self"): blocked on the host instead of spinning."""
        state.activity = blocked(state.activity.memory_fraction)
        state.load = state.activity.load
        state.throttle |= IDLE
