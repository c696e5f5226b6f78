"""Fault kind ``host_memory_pressure``: a node's host runs out of memory.

Available memory falls to under 1 % of the total, the kernel reclaims page cache and swaps, and the CPUs spend a
third to a half of their time waiting for I/O. The jobs on the node (or the named job, on each of its nodes) fill
their cgroups' memory and starve: their GPUs are mostly idle while the data loaders wait on the disk. Named by
``node`` (every job running there at ``at`` feels it) or by ``job`` (the hosts of the job's nodes).
"""

from __future__ import annotations

from typing import Final

from gpulens.exporter.sim.faults.host_cpu_contention import STARVED_COMM_FRACTION, STARVED_PACE, starved
from gpulens.exporter.sim.faults.kind import REACHES_NODE_JOBS, FaultKind, NodeOrJobFaultParams
from gpulens.exporter.sim.specs import FaultSpec
from gpulens.exporter.sim.stepstate import STARVED, HostState, JobPhase

RECLAIM_CPU_SHARE: Final = 0.25  # of its cgroup CPU limit: the loaders block on I/O, they do not compute


class HostMemoryPressureParams(NodeOrJobFaultParams, frozen=True, tag="host_memory_pressure"):
    """``node`` or ``job``; ``at``, ``duration``."""


class HostMemoryPressure(FaultKind):
    name = "host_memory_pressure"
    params = HostMemoryPressureParams
    target = "node"
    job_target = True
    fabric = True
    reaches = REACHES_NODE_JOBS
    phase_priority = 8

    def job_phase(self, fault: FaultSpec) -> JobPhase:
        return JobPhase(STARVED, comm_fraction=STARVED_COMM_FRACTION, intensity=RECLAIM_CPU_SHARE, activity=starved)

    def fabric_pace(self, fault: FaultSpec, t: float) -> float:
        return STARVED_PACE

    def host(self, fault: FaultSpec, t: float, state: HostState) -> None:
        state.memory_pressure = True
