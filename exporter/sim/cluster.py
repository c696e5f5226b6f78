"""The simulated cluster: a node's readings at any virtual time, computed (never slept for) and reproducible.

Time is quantised to the scenario's step: any ``t`` inside step ``k`` gives step ``k``'s readings, stamped with the
step's start. Each GPU's readings are built in two stages: ``_state`` works out what the GPU does during a step from
its jobs and faults (no noise; each active fault's kind adjusts it, ``gpulens.exporter.sim.faults``), then
``exporter.sim.readings`` adds noise drawn from a hash of (seed, node, GPU, step) and turns ratios into NVML units.
GPUs whose jobs and faults are alike share a context, and with it the running sum of their nominal power that the
energy counter is built from.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Final

from gpulens.config import format_timestamp
from gpulens.exporter.sim import noise
from gpulens.exporter.sim.behaviour import JobBehaviour, activity, combine, rank_shaper
from gpulens.exporter.sim.clockevents import IDLE, SW_POWER_CAP
from gpulens.exporter.sim.fabric import Fabric
from gpulens.exporter.sim.faults import FAULT_KINDS, LEAK_TARGET_SHARE
from gpulens.exporter.sim.gpus import EnergyLedger, GpuContext, SimGpu, make_gpu
from gpulens.exporter.sim.hardware import node_hardware
from gpulens.exporter.sim.host import HostSim
from gpulens.exporter.sim.inspectorsim import InspectorSim
from gpulens.exporter.sim.kernlog import XID_KINDS, NodeKernelLog
from gpulens.exporter.sim.ncclsim import NcclSim
from gpulens.exporter.sim.readings import DRIVER_VERSION, gpu_reading, link_readings, lost_reading, process_readings
from gpulens.exporter.sim.specs import FaultSpec, GpuRef, JobSpec, NodeSpec, Scenario
from gpulens.exporter.sim.stepstate import (
    CHECKPOINT,
    Activity,
    GpuState,
    JobPhase,
    Placement,
    idle_activity,
)
from gpulens.model import GpuJob, GpuReading, LinkReading, NodeSnapshot, NodeUnavailableError, ProcessReading
from gpulens.nodehardware import with_sxids

SOURCE_NAME: Final = "sim"
_PHASE_CACHE_LIMIT: Final = 200_000
CHECKPOINT_WRITER_PCIE_TX: Final = 0.05  # share of the PCIe ceiling a checkpoint_ranks writer sends to the host

__all__ = ["DRIVER_VERSION", "LEAK_TARGET_SHARE", "SOURCE_NAME", "SimCluster", "UnknownNodeError"]


class UnknownNodeError(KeyError):
    """The scenario has no node of that name."""

    def __init__(self, node: str, known: list[str]) -> None:
        shown = ", ".join(known[:6]) + (f", ... ({len(known)} in all)" if len(known) > 6 else "")
        self.node = node
        self.message = f"unknown node {node!r} (the scenario has {shown})"
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


class SimCluster:
    """Every node of a scenario, readable at any virtual time."""

    def __init__(
        self,
        scenario: Scenario,
        *,
        stamp: Callable[[float], float] | None = None,
        counter_scale: float = 1.0,
        nccl_ras: bool = True,
        ras_over_tcp: bool = False,
    ) -> None:
        """``stamp`` maps a step's virtual time to the timestamp its readings carry (default: the virtual time
        itself); a live exporter passes ``LiveTime.to_real`` so that readings carry wall-clock times, and
        ``counter_scale=1/speed`` so that counters (energy, link errors) grow at their real rate per real second:
        otherwise a GPU drawing 500 W would show an energy rate of 500 W x speed."""
        self._scenario = scenario
        self._stamp = stamp
        self._counter_scale = counter_scale
        self._step = scenario.step_s
        self._last_step = math.ceil(scenario.duration_s / scenario.step_s) + 1
        self._behaviours = {
            job.id: JobBehaviour(job, self._job_faults(job), scenario.seed, scenario.start, scenario.step_s)
            for job in scenario.jobs
        }
        self._phases: dict[tuple[str, int], JobPhase | None] = {}
        self._contexts: dict[tuple[object, ...], GpuContext] = {}
        self._jobs_on: dict[GpuRef, list[JobSpec]] = {}
        self._local_gpus: dict[tuple[str, str], list[GpuRef]] = {}
        for job in scenario.jobs:
            for ref in job.gpus:
                self._jobs_on.setdefault(ref, []).append(job)
                self._local_gpus.setdefault((job.id, ref.node), []).append(ref)
        self._job_nodes = {job.id: len({g.node for g in job.gpus}) for job in scenario.jobs}
        self._nodes = {n.name: [self._gpu(n, i) for i in range(n.gpus)] for n in scenario.nodes}
        self._node_down = {
            n.name: tuple(f for f in scenario.faults if FAULT_KINDS[f.kind].takes_node_offline and f.node == n.name)
            for n in scenario.nodes
        }
        self._nvml_hangs = {
            n.name: tuple(f for f in scenario.faults if FAULT_KINDS[f.kind].hangs_nvml and f.node == n.name)
            for n in scenario.nodes
        }
        self._last: dict[str, tuple[int, NodeSnapshot]] = {}
        self._kernel = {
            n.name: NodeKernelLog(
                (
                    f
                    for f in scenario.faults
                    if (f.kind in XID_KINDS and f.gpu is not None and f.gpu.node == n.name)
                    or (f.kind == "sxid" and f.node == n.name)
                ),
                {g.ref.index: g.pci_bus_id for g in self._nodes[n.name]},
                scenario.start,
            )
            for n in scenario.nodes
        }
        self._specs = {n.name: n for n in scenario.nodes}
        self._node_faults = {  # what names the node as a whole (its plumbing faults among them)
            n.name: tuple(f for f in scenario.faults if f.node == n.name and f.gpu is None) for n in scenario.nodes
        }
        self._fabric = Fabric(scenario, self._behaviours, self._phase, counter_scale)
        self._hosts = HostSim(scenario, self._phase, counter_scale)
        self.nccl = NcclSim(
            list(scenario.jobs),
            list(scenario.faults),
            list(self._nodes),
            self._phase,
            self._pids,
            self._nccl_light,
            seed=scenario.seed,
            origin=scenario.start,
            step_s=scenario.step_s,
            tcp=ras_over_tcp,
        )
        self.inspector = InspectorSim(
            list(scenario.jobs),
            list(scenario.faults),
            self._phase,
            self._pids,
            lambda ref: self._nodes[ref.node][ref.index].uuid,
            self._nic_gpus,
            seed=scenario.seed,
            step_s=scenario.step_s,
        )
        self._nccl_on = nccl_ras  # the agents read NCCL RAS (each node's RAS on a real port with ras_over_tcp)

    def close(self) -> None:
        """Stop the simulated RAS ports (``ras_over_tcp``)."""
        self.nccl.close()

    def _nic_gpus(self, node: str, device: str) -> tuple[int, ...]:
        nic = self._specs[node].nic(device) if node in self._specs else None
        return nic.gpus if nic is not None else ()

    def _nccl_light(self, node: str, k: int) -> NodeSnapshot:
        """What the node's RAS reader needs at step ``k``: its GPUs and their jobs' processes (pid, job)."""
        t = self.step_time(k)
        gpus: list[GpuReading] = []
        processes: list[ProcessReading] = []
        for gpu in self._nodes[node]:
            gpus.append(GpuReading(node, gpu.ref.index, gpu.uuid, "", t))
            processes.extend(
                ProcessReading(node, gpu.ref.index, gpu.uuid, gpu.pids[job.id], job_id=job.id)
                for job in self._jobs_on.get(gpu.ref, [])
                if job.running(t)
            )
        return NodeSnapshot(node, t, SOURCE_NAME, gpus=tuple(gpus), processes=tuple(processes))

    @property
    def scenario(self) -> Scenario:
        return self._scenario

    def node_names(self) -> list[str]:
        return list(self._nodes)

    def step_index(self, t: float) -> int:
        """The step that virtual time ``t`` falls in (negative before the scenario's start)."""
        return math.floor((t - self._scenario.start) / self._step + 1e-9)

    def step_time(self, k: int) -> float:
        return self._scenario.start + k * self._step

    def snapshot(self, node: str, t: float) -> NodeSnapshot:
        """The node's readings at virtual time ``t``.

        Raises ``UnknownNodeError`` for a node the scenario lacks and ``NodeUnavailableError`` while an
        ``exporter_down`` fault covers the node.
        """
        gpus = self._nodes.get(node)
        if gpus is None:
            raise UnknownNodeError(node, self.node_names())
        k = self.step_index(t)
        ts = self.step_time(k)
        for fault in self._node_down[node]:
            if fault.active(ts):
                until = format_timestamp(fault.end)
                raise NodeUnavailableError(FAULT_KINDS[fault.kind].offline_message(fault, node, until))
        cached = self._last.get(node)
        if cached is not None and cached[0] == k:
            return cached[1]
        snap = self._build(node, gpus, k, ts if self._stamp is None else self._stamp(ts))
        for fault in self._nvml_hangs[node]:
            if fault.active(ts):  # as a real exporter serves a hung driver: GPU readings withdrawn, marked stale
                since = fault.start if self._stamp is None else self._stamp(fault.start)
                snap = snap.replace(
                    gpus=(), links=(), processes=(), migs=(), stale={"gpus": ts - fault.start}, nvml_hung_since=since
                )
        self._last[node] = (k, snap)
        return snap

    # ------------------------------------------------------------------------------------------ set-up

    def _job_faults(self, job: JobSpec) -> tuple[FaultSpec, ...]:
        """Faults that act through the job's phases: job-scoped ones, stragglers among its GPUs, and fabric and
        host faults that hit it."""
        return tuple(
            f
            for f in self._scenario.faults
            if (f.job == job.id and not FAULT_KINDS[f.kind].fabric) or job.id in f.jobs_hit
        )

    def _gpu(self, node: NodeSpec, index: int) -> SimGpu:
        ref = GpuRef(node.name, index)
        return make_gpu(self._scenario.seed, ref, node.model, self._context(node, ref), self._pids(ref))

    def _pids(self, ref: GpuRef) -> dict[str, int]:
        pids: dict[str, int] = {}
        for job in self._jobs_on.get(ref, []):
            base = 2000 + int(noise.unit("pid", ref.node, job.id) * 4_000_000)
            pids[job.id] = base + self._local_gpus[job.id, ref.node].index(ref)
        return pids

    def _context(self, node: NodeSpec, ref: GpuRef) -> GpuContext:
        jobs = self._jobs_on.get(ref, [])
        placements = tuple(
            Placement(
                job=j,
                local_gpus=len(self._local_gpus[j.id, node.name]),
                nodes=self._job_nodes[j.id],
                nvlink=node.model.has_nvlink,
            )
            for j in jobs
        )
        faults = tuple((f, role) for f in self._scenario.faults if (role := self._role(f, ref, jobs)) is not None)
        key = (
            node.model.name,
            tuple((p.job.id, p.local_gpus) for p in placements),
            tuple((f.index, role) for f, role in faults),
        )
        known = self._contexts.get(key)
        if known is not None:
            return known
        context = GpuContext(node.model, placements, faults)
        static = not placements and not faults
        context.ledger = EnergyLedger(
            lambda k: self._state(context, k).power_watts, 0 if static else self._last_step, self._step
        )
        self._contexts[key] = context
        return context

    @staticmethod
    def _role(fault: FaultSpec, ref: GpuRef, jobs: list[JobSpec]) -> str | None:
        if FAULT_KINDS[fault.kind].fabric:  # it reaches GPUs only through the jobs it hits
            return "job" if any(j.id in fault.jobs_hit for j in jobs) else None
        if fault.gpu == ref or ref in fault.ranks:
            return "self"
        if fault.node == ref.node:
            return "node"
        if fault.job is not None and any(j.id == fault.job for j in jobs):
            return "job"  # a job-scoped fault, or a straggler among this GPU's peers
        return None

    # ------------------------------------------------------------------------------------------ per step

    def _phase(self, job_id: str, k: int) -> JobPhase | None:
        key = (job_id, k)
        try:
            return self._phases[key]
        except KeyError:
            pass
        if len(self._phases) > _PHASE_CACHE_LIMIT:
            self._phases.clear()
        phase = self._behaviours[job_id].phase(k)
        self._phases[key] = phase
        return phase

    def _copying(self, job_id: str, k: int) -> bool:
        phase = self._phase(job_id, k)
        return phase is not None and phase.mode == CHECKPOINT

    def _state(self, ctx: GpuContext, k: int) -> GpuState:
        t = self.step_time(k)
        model = ctx.model
        active = [(f, role) for f, role in ctx.faults if f.active(t)] if ctx.faults else []
        shaper = rank_shaper(active) if active else None
        acts: list[Activity] = []
        jobs: list[JobSpec] = []
        for place in ctx.placements:
            phase = self._phase(place.job.id, k)
            if phase is not None:
                acts.append(activity(phase, place, shaper))
                jobs.append(place.job)
        act = combine(acts) if acts else idle_activity()
        state = GpuState(
            activity=act,
            jobs=tuple(jobs),
            load=act.load,
            power_limit_watts=model.board_power_watts,
            throttle=0 if act.busy else IDLE,
            pcie_generation=model.pcie_generation,
            pcie_width=model.pcie_width,
        )
        for fault, fault_role in active:
            if fault_role != "job":  # job-scoped faults and a straggler's peers act through the job's phase
                FAULT_KINDS[fault.kind].apply(state, fault, t, model)
        power = model.idle_power_watts + state.load * (model.board_power_watts - model.idle_power_watts)
        if power > state.power_limit_watts:
            state.clock_share = min(state.clock_share, math.sqrt(state.power_limit_watts / power))
            power = state.power_limit_watts
            state.throttle |= SW_POWER_CAP
        state.power_watts = power
        return state

    def _build(self, node: str, gpus: list[SimGpu], k: int, ts: float) -> NodeSnapshot:
        readings: list[GpuReading] = []
        links: list[LinkReading] = []
        processes: list[ProcessReading] = []
        jobs: list[GpuJob] = []
        t = self.step_time(k)
        missing: list[SimGpu] = []
        for gpu in gpus:
            state = self._state(gpu.context, k)
            if any(gpu.ref in j.checkpoint_ranks and self._copying(j.id, k) for j in state.jobs):
                # a writer's GPU copies its state to the host in the save's first steps (docs/scenarios-nccl.md)
                state.activity = dataclasses.replace(
                    state.activity, pcie_tx=max(state.activity.pcie_tx, CHECKPOINT_WRITER_PCIE_TX)
                )
            if state.missing:
                missing.append(gpu)
                continue
            jobs.extend(GpuJob(node, gpu.ref.index, gpu.uuid, j.id, j.user) for j in state.jobs)
            if state.lost:
                readings.append(lost_reading(gpu, ts))
                continue
            reading = gpu_reading(gpu, k, t, ts, state, self._counter_scale)
            readings.append(reading)
            links.extend(link_readings(gpu, reading))
            processes.extend(process_readings(gpu, state, reading))
        host, job_hosts = self._hosts.readings(node, k, t)
        readings, kernel = self._kernel[node].merge(readings, t)
        nics = self._fabric.readings(node, k, t)
        spec = self._specs[node]
        hardware = with_sxids(
            node_hardware(spec, gpus, missing, self._node_faults[node], t, nics), kernel.sxids if kernel else ()
        )
        snapshot = NodeSnapshot(
            node=node,
            timestamp=ts,
            source=SOURCE_NAME,
            gpus=tuple(readings),
            links=tuple(links),
            processes=tuple(processes),
            jobs=tuple(jobs),
            driver_version=DRIVER_VERSION,
            nics=nics,
            host=host,
            job_hosts=job_hosts,
            kernel=kernel,
            hardware=hardware,
        )
        if self.inspector.active:
            view = self.inspector.view(node, k, t)
            if view is not None:
                snapshot = snapshot.replace(inspector=view)
        return self.nccl.enrich(node, snapshot, k, t) if self._nccl_on and self.nccl.active else snapshot
