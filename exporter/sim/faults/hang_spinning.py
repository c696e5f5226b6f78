"""Fault kind ``hang_spinning``: every rank of a training job spins in a collective that never completes.

The same effect as ``comm_stall`` (which keeps its name for older scenarios), :func:`~.comm_stall.spinning`: ~1.0
utilization with clocks up, NVLink and PCIe traffic ~0, SM activity ~0.03, tensor activity 0, power about idle,
memory exactly flat.
"""

from __future__ import annotations

from gpulens.exporter.sim.faults.comm_stall import spinning
from gpulens.exporter.sim.faults.kind import FaultKind, JobFaultParams, ScenarioView, require_multi_gpu_training
from gpulens.exporter.sim.specs import FaultSpec, JobSpec
from gpulens.exporter.sim.stepstate import STALL, JobPhase


class HangSpinningParams(JobFaultParams, frozen=True, tag="hang_spinning"):
    """``job``, ``at``, ``duration``; ``stuck_ranks``: GPU ranges whose ranks never launch the collective."""

    stuck_ranks: str | list[str] | None = None


class HangSpinning(FaultKind):
    name = "hang_spinning"
    params = HangSpinningParams
    target = "job"
    job_bound = True
    phase_priority = 1

    def check(self, fault: FaultSpec, job: JobSpec | None, scenario: ScenarioView) -> None:
        require_multi_gpu_training(self, job)

    def job_phase(self, fault: FaultSpec) -> JobPhase:
        return JobPhase(STALL, activity=spinning)
