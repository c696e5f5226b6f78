"""Fault kind ``comm_stall``: a training job hangs in an NCCL collective (every rank spins, nothing moves).

Each GPU of the job stays at ~1.0 utilization with clocks up while NVLink and PCIe traffic fall to ~0, SM activity
to ~0.03, tensor activity to 0, and memory stays exactly flat. Its power is about idle power (``SPIN_LOAD``: measured
on an H200, a rank spin-waiting in a collective draws 123 W against 122 W idle after load, docs/domain.md §7).
``hang_spinning`` is the same hang under the name of its signature; both share :func:`spinning`.
"""

from __future__ import annotations

from gpulens.exporter.sim.faults.kind import FaultKind, JobFaultParams, ScenarioView, require_multi_gpu_training
from gpulens.exporter.sim.specs import FaultSpec, JobSpec
from gpulens.exporter.sim.stepstate import SPIN_LOAD, STALL, Activity, JobPhase, Placement


class CommStallParams(JobFaultParams, frozen=True, tag="comm_stall"):
    """``job``, ``at``, ``duration``."""


def spinning(place: Placement) -> Activity:
    """A spinning NCCL kernel: "100% utilization", no traffic, power about idle, memory flat."""
    trickle = 1e-4 if place.nvlink_peers else 0.0
    return Activity(1.0, 0.03, 0.0, 0.01, SPIN_LOAD, trickle, 2e-4, 2e-4, place.job.memory_fraction, True, False)


class CommStall(FaultKind):
    name = "comm_stall"
    params = CommStallParams
    target = "job"
    job_bound = True
    phase_priority = 0

    def check(self, fault: FaultSpec, job: JobSpec | None, scenario: ScenarioView) -> None:
        require_multi_gpu_training(self, job)

    def job_phase(self, fault: FaultSpec) -> JobPhase:
        return JobPhase(STALL, activity=spinning)
