"""The simulated host: each node's CPUs and memory, and each job's share of them (its cgroup), step by step.

A node's CPUs and memory follow its GPU model's usual server (an HGX H100/H200 board sits in a two-socket server
with 2 x 56 cores, 224 threads and 2 TiB of memory). Each job on a node runs in a cgroup v2 group
(``/slurm/uid_<uid>/job_<id>``) limited to 16 cores and its share of the memory per GPU; its data loaders use a
moderate share of that CPU while it trains, more while it waits for data, and all of it when its input pipeline
starves (``host_cpu_contention``). ``host_memory_pressure`` drives the node's available memory to near zero and its
I/O wait to a third to a half of CPU time. ``cpu_seconds_total`` is the running sum of the job's CPU use, so it
always agrees with ``cpu_used_cores``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from gpulens.exporter.sim import noise
from gpulens.exporter.sim.faults import FAULT_KINDS
from gpulens.exporter.sim.ledger import RateLedger
from gpulens.exporter.sim.specs import FaultSpec, JobSpec, NodeSpec, Scenario
from gpulens.exporter.sim.stepstate import (
    BURST,
    CHECKPOINT,
    CHECKPOINT_WRITE,
    DATA_WAIT,
    EVAL,
    IDLE,
    QUIET,
    RUN,
    SERVE,
    STALL,
    STARVED,
    WARMUP,
    HostState,
    JobPhase,
)
from gpulens.fabricmodel import HostReading, JobHostReading

GIB: Final = 1 << 30
CORES_PER_GPU: Final = 16.0  # a job's cgroup CPU limit per GPU it holds
MEMORY_LIMIT_SHARE: Final = 0.9  # of the node's memory, shared out per GPU, as the jobs' cgroup limits
SYSTEM_CORES: Final = 2.0  # the OS, the agents, the container runtime
SYSTEM_MEMORY_BYTES: Final = 24 * GIB
PRESSURE_AVAILABLE_SHARE: Final = 0.004  # of total memory left available under memory pressure (0.4-0.8 %)
PRESSURE_IOWAIT: Final = 0.30  # to 0.50
PRESSURE_JOB_MEMORY_SHARE: Final = 0.97  # of its cgroup limit

# Share of its cgroup CPU limit a job uses in each mode (STARVED: the phase's own ``intensity``).
_CPU_SHARE: Final[Mapping[str, float]] = {
    RUN: 0.32,
    DATA_WAIT: 0.85,
    CHECKPOINT: 0.25,
    CHECKPOINT_WRITE: 0.25,
    EVAL: 0.30,
    WARMUP: 0.45,  # compiling
    STALL: 0.0625,  # one proxy thread per rank polling the network
    SERVE: 0.10,
    BURST: 0.15,
    QUIET: 0.02,
    IDLE: 0.01,
}
# Host memory a job holds per GPU, by kind (pinned buffers, the data loaders' workers and their caches).
_MEMORY_PER_GPU: Final[Mapping[str, int]] = {
    "training": 48 * GIB,
    "inference": 24 * GIB,
    "notebook": 12 * GIB,
    "idle": GIB,
}


@dataclass(frozen=True, slots=True)
class HostSpec:
    """A server's logical CPUs and memory."""

    cpus: int
    memory_bytes: int


HOSTS: Final[Mapping[str, HostSpec]] = {
    "H100-SXM5-80GB": HostSpec(224, 2048 * GIB),  # 2 x 56 cores, two threads each
    "H200-SXM-141GB": HostSpec(224, 2048 * GIB),
    "A100-SXM4-80GB": HostSpec(256, 2048 * GIB),  # 2 x 64 cores
    "L40S": HostSpec(128, 1024 * GIB),  # 2 x 32 cores
}
FALLBACK_HOST: Final = HostSpec(128, 1024 * GIB)

PhaseOf = Callable[[str, int], JobPhase | None]


def host_spec(node: NodeSpec) -> HostSpec:
    return HOSTS.get(node.model.name, FALLBACK_HOST)


def cgroup_path(job: JobSpec) -> str:
    """The job's cgroup as Slurm names it: ``/slurm/uid_<uid>/job_<id>``."""
    uid = 1000 + int(noise.unit("uid", job.user) * 60000)
    return f"/slurm/uid_{uid}/job_{job.id}"


class HostSim:
    """Every node's host and every job's cgroup, with the running sums of the jobs' CPU time."""

    def __init__(self, scenario: Scenario, phase_of: PhaseOf, counter_scale: float) -> None:
        self._scenario = scenario
        self._phase_of = phase_of
        self._scale = counter_scale
        self._step = scenario.step_s
        self._last_step = math.ceil(scenario.duration_s / scenario.step_s) + 1
        self._specs = {n.name: n for n in scenario.nodes}
        self._jobs = {j.id: j for j in scenario.jobs}
        self._local: dict[str, list[tuple[JobSpec, int]]] = {n.name: [] for n in scenario.nodes}
        for job in scenario.jobs:
            counts: dict[str, int] = {}
            for g in job.gpus:
                counts[g.node] = counts.get(g.node, 0) + 1
            for node, count in counts.items():
                self._local[node].append((job, count))
        self._faults: dict[str, tuple[FaultSpec, ...]] = {
            n.name: tuple(f for f in scenario.faults if self._reaches_host(f, n.name)) for n in scenario.nodes
        }
        self._keys = {n.name: noise.key(scenario.seed, "host", n.name) for n in scenario.nodes}
        self._job_keys = {j.id: noise.key(scenario.seed, "jobcpu", j.id) for j in scenario.jobs}
        self._cgroups = {j.id: cgroup_path(j) for j in scenario.jobs}
        self._ledgers: dict[str, RateLedger] = {}

    def _reaches_host(self, fault: FaultSpec, node: str) -> bool:
        kind = FAULT_KINDS[fault.kind]
        if not kind.fabric or kind.target == "nic":
            return False
        if fault.node is not None:
            return fault.node == node
        job = self._jobs.get(fault.job or "")
        return job is not None and any(g.node == node for g in job.gpus)

    def _cpu_share(self, job: JobSpec, k: int) -> float:
        """Share of its CPU limit the job uses during step ``k`` (0 when it does not run)."""
        phase = self._phase_of(job.id, k)
        if phase is None:
            return 0.0
        base = phase.intensity if phase.mode == STARVED else _CPU_SHARE.get(phase.mode, 0.1)
        if base >= 1.0:
            return 1.0
        return min(1.0, base * (1.0 + noise.spread(noise.value(self._job_keys[job.id], k), 0.15)))

    def _ledger(self, job: JobSpec) -> RateLedger:
        ledger = self._ledgers.get(job.id)
        if ledger is None:
            ledger = RateLedger(lambda k: (self._cpu_share(job, k),), 1, self._last_step, self._step)
            self._ledgers[job.id] = ledger
        return ledger

    def readings(self, node: str, k: int, t: float) -> tuple[HostReading, tuple[JobHostReading, ...]]:
        """The node's host and its jobs' cgroups during step ``k`` (virtual time ``t``)."""
        spec = self._specs[node]
        host = host_spec(spec)
        state = HostState()
        for fault in self._faults[node]:
            if fault.active(t):
                FAULT_KINDS[fault.kind].host(fault, t, state)
        u = noise.draw(self._keys[node], k)
        jobs: list[JobHostReading] = []
        cores = SYSTEM_CORES
        used = SYSTEM_MEMORY_BYTES + int(noise.spread(u[0], GIB))
        checkpointing = False
        for i, (job, local) in enumerate(self._local[node]):
            if not job.running(t):
                continue
            limit_cores = CORES_PER_GPU * local
            ledger = self._ledger(job)
            (share,), (used_share,) = ledger.at(k)
            phase = self._phase_of(job.id, k)
            checkpointing |= phase is not None and phase.mode in (CHECKPOINT, CHECKPOINT_WRITE)
            memory_limit = int(host.memory_bytes * MEMORY_LIMIT_SHARE * local / spec.gpus) // GIB * GIB
            if state.memory_pressure:
                memory = int(memory_limit * PRESSURE_JOB_MEMORY_SHARE)
            else:
                per_gpu = _MEMORY_PER_GPU.get(job.kind, GIB)
                memory = min(memory_limit, int(per_gpu * local * (1.0 + noise.spread(u[(4 + i) % 32], 0.02))))
            cores += share * limit_cores
            used += memory
            jobs.append(
                JobHostReading(
                    node=node,
                    job_id=job.id,
                    cgroup=self._cgroups[job.id],
                    cgroup_version=2,
                    cpu_seconds_total=round(used_share * limit_cores * self._scale, 3),
                    cpu_limit_cores=limit_cores,
                    memory_used_bytes=memory,
                    memory_limit_bytes=memory_limit,
                    cpu_used_cores=round(share * limit_cores, 3),
                )
            )
        total = host.memory_bytes
        if state.memory_pressure:
            available = int(total * PRESSURE_AVAILABLE_SHARE * (1.0 + u[1]))
            iowait = PRESSURE_IOWAIT + 0.2 * u[2]
            busy = min(1.0, cores / host.cpus + 0.05 + noise.spread(u[3], 0.01))
        else:
            available = max(0, total - used)
            iowait = 0.002 + 0.004 * u[2] + (0.02 if checkpointing else 0.0)
            busy = min(1.0, max(0.0, cores / host.cpus + noise.spread(u[3], 0.01)))
        reading = HostReading(
            node=node,
            cpus=host.cpus,
            cpu_busy_ratio=round(busy, 4),
            cpu_iowait_ratio=round(iowait, 4),
            memory_total_bytes=total,
            memory_used_bytes=total - available,
            memory_available_bytes=available,
        )
        return reading, tuple(jobs)
