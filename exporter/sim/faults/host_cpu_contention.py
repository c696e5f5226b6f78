"""Fault kind ``host_cpu_contention``: a training job's data loader starves for CPU.

The job's cgroup uses all the CPU its limit allows, yet its input pipeline cannot keep up: its GPUs are mostly
idle (utilization ~0.15, short bursts of compute between long waits for the next batch), and a job spanning nodes
moves a fraction of its usual inter-node traffic.
"""

from __future__ import annotations

from typing import Final

from gpulens.exporter.sim.faults.kind import FaultKind, JobFaultParams, ScenarioView, require_training
from gpulens.exporter.sim.specs import FaultSpec, JobSpec
from gpulens.exporter.sim.stepstate import STARVED, Activity, JobPhase, Placement

STARVED_COMM_FRACTION: Final = 0.3
STARVED_PACE: Final = 0.15  # of the healthy inter-node throughput: a step now and then


class HostCpuContentionParams(JobFaultParams, frozen=True, tag="host_cpu_contention"):
    """``job``, ``at``, ``duration``."""


def starved(place: Placement) -> Activity:
    """A GPU waiting on its input pipeline: mostly idle, a short burst of compute now and then, memory held."""
    nvlink = 0.01 if place.nvlink_peers else 0.0
    return Activity(0.15, 0.09, 0.05, 0.05, 0.12, nvlink, 0.01, 0.03, place.job.memory_fraction, True, True)


class HostCpuContention(FaultKind):
    name = "host_cpu_contention"
    params = HostCpuContentionParams
    target = "job"
    fabric = True
    job_bound = True
    phase_priority = 9

    def check(self, fault: FaultSpec, job: JobSpec | None, scenario: ScenarioView) -> None:
        require_training(self, job)

    def job_phase(self, fault: FaultSpec) -> JobPhase:
        return JobPhase(STARVED, comm_fraction=STARVED_COMM_FRACTION, intensity=1.0, activity=starved)

    def fabric_pace(self, fault: FaultSpec, t: float) -> float:
        return STARVED_PACE
