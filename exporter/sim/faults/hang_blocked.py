"""Fault kind ``hang_blocked``: every rank of a training job is blocked on the host (a hang outside the GPU).

Each GPU of the job falls to 0 utilization with idle clocks and the idle throttle reason, power at idle, SM and
tensor activity 0, NVLink and PCIe traffic ~0, while the job's memory stays held and exactly flat. GPU by GPU this
looks like an idle allocation; what makes it a hang is the job's communicating work before it.
"""

from __future__ import annotations

from gpulens.exporter.sim.faults.kind import FaultKind, JobFaultParams, ScenarioView, require_multi_gpu_training
from gpulens.exporter.sim.specs import FaultSpec, JobSpec
from gpulens.exporter.sim.stepstate import STALL, Activity, JobPhase, Placement, idle_activity


class HangBlockedParams(JobFaultParams, frozen=True, tag="hang_blocked"):
    """``job``, ``at``, ``duration``; ``stuck_ranks``: GPU ranges whose ranks never launch the collective."""

    stuck_ranks: str | list[str] | None = None


def blocked(memory_fraction: float) -> Activity:
    """A rank blocked on the host: the GPU idles with the job's memory held, nothing moves."""
    return idle_activity(memory_fraction)


def _blocked_rank(place: Placement) -> Activity:
    return blocked(place.job.memory_fraction)


class HangBlocked(FaultKind):
    name = "hang_blocked"
    params = HangBlockedParams
    target = "job"
    job_bound = True
    phase_priority = 2

    def check(self, fault: FaultSpec, job: JobSpec | None, scenario: ScenarioView) -> None:
        require_multi_gpu_training(self, job)

    def job_phase(self, fault: FaultSpec) -> JobPhase:
        return JobPhase(STALL, activity=_blocked_rank)
