"""Fault kind ``idle_allocated``: a job keeps its GPUs allocated and its memory held, but does no work."""

from __future__ import annotations

from gpulens.exporter.sim.faults.kind import FaultKind, JobFaultParams
from gpulens.exporter.sim.specs import FaultSpec
from gpulens.exporter.sim.stepstate import IDLE, JobPhase


class IdleAllocatedParams(JobFaultParams, frozen=True, tag="idle_allocated"):
    """``job``, ``at``, ``duration``."""


class IdleAllocated(FaultKind):
    name = "idle_allocated"
    params = IdleAllocatedParams
    target = "job"
    job_bound = True
    phase_priority = 4

    def job_phase(self, fault: FaultSpec) -> JobPhase:
        return JobPhase(IDLE)  # idle clocks and throttle reason, the job's memory held
