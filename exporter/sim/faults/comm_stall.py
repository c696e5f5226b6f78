"""Fault kind ``comm_stall``: a training job hangs in an NCCL collective (every rank spins, nothing moves).

Each GPU of the job stays at ~1.0 utilization with clocks up while NVLink and PCIe traffic fall to ~0, SM activity
to ~0.03, tensor activity to 0, and memory stays exactly flat. Its power load is 12% of the dynamic range
(idle + 0.12 x (board - idle): ~146 W on an H100). Measured on an H200, a rank spin-waiting in a collective draws
about idle power (123 W against 122 W idle after load); calibrating this load is left to a later change.
"""

from __future__ import annotations

from typing import Final

from exporter.sim.specs import FaultSpec, JobSpec
from exporter.sim.state import STALL, Activity, JobPhase, Placement

from .base import FaultKind, JobFaultParams, ScenarioView, require_multi_gpu_training

STALL_LOAD: Final = 0.12  # share of the dynamic power range while spinning


class CommStallParams(JobFaultParams, frozen=True, tag="comm_stall"):
    """``job``, ``at``, ``duration``."""


def stalled(place: Placement) -> Activity:
    """A spinning NCCL kernel: "100% utilization", no traffic, power toward idle, memory flat."""
    trickle = 1e-4 if place.nvlink_peers else 0.0
    return Activity(1.0, 0.03, 0.0, 0.01, STALL_LOAD, trickle, 2e-4, 2e-4, place.job.memory_fraction, True, False)


class CommStall(FaultKind):
    name = "comm_stall"
    params = CommStallParams
    target = "job"
    job_bound = True
    phase_priority = 0

    def check(self, fault: FaultSpec, job: JobSpec | None, scenario: ScenarioView) -> None:
        require_multi_gpu_training(self, job)

    def job_phase(self, fault: FaultSpec) -> JobPhase:
        return JobPhase(STALL, activity=stalled)
