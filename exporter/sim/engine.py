"""The simulated cluster: a node's readings at any virtual time, computed (never slept for) and reproducible.

Time is quantised to the scenario's step: any ``t`` inside step ``k`` gives step ``k``'s readings, stamped with the
step's start. Each GPU's readings are built in two stages: ``_state`` works out what the GPU does during a step from
its jobs and faults (no noise), then ``_reading`` adds noise drawn from a hash of (seed, node, GPU, step) and turns
ratios into NVML units. GPUs whose jobs and faults are alike share a context, and with it the running sum of their
nominal power that the energy counter is built from.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import threading
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from gpulens.config import format_timestamp
from gpulens.model import (
    THROTTLE_REASONS,
    GpuJob,
    GpuReading,
    LinkReading,
    NodeSnapshot,
    NodeUnavailableError,
    ProcessReading,
)

from . import noise
from .behaviour import Activity, JobBehaviour, JobPhase, Placement, activity, combine, idle_activity
from .models import GpuModel, pcie_max_bytes_per_second
from .scenario import FaultSpec, GpuRef, JobSpec, NodeSpec, Scenario

DRIVER_VERSION: Final = "550.127.08"
SOURCE_NAME: Final = "sim"

_BIT: Final = dict(THROTTLE_REASONS)
_IDLE: Final = _BIT["idle"]
_SW_POWER_CAP: Final = _BIT["sw_power_cap"]
_THERMAL: Final = _BIT["sw_thermal"] | _BIT["hw_thermal"] | _BIT["hw_slowdown"]
_SW_THERMAL: Final = _BIT["sw_thermal"]

_MIB: Final = 1 << 20
_MHZ: Final = 1_000_000.0
_IDLE_MEMORY_BYTES: Final = _MIB
_PROCESS_MIN_BYTES: Final = 512 * _MIB
_HGX_BUS: Final = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_COMMANDS: Final = {"training": "python", "inference": "vllm", "notebook": "python", "idle": "python"}

POWER_CAP_SHARE: Final = 0.5  # power_cap lowers the enforced limit to this share of board power
LEAK_TARGET_SHARE: Final = 0.985  # memory_leak ends its window with this share of total memory used
PCIE_SATURATION_SHARE: Final = 0.94
THERMAL_CLOCK_SHARE: Final = 0.55
STRAGGLER_CLOCK_SHARE: Final = 0.68
NVLINK_CRC_PER_S: Final = 250.0
NVLINK_REPLAY_PER_S: Final = 12.0
NVLINK_RECOVERY_PER_S: Final = 0.2
DEGRADED_PCIE_REPLAYS_PER_S: Final = 1.5
_PHASE_CACHE_LIMIT: Final = 200_000

# Positions of each signal in a GPU's noise draw.
(_U_UTIL, _U_POWER, _U_TEMP, _U_SM, _U_TENSOR, _U_DRAM, _U_NVL_TX, _U_NVL_RX) = range(8)
(_U_PCIE_TX, _U_PCIE_RX, _U_MEMORY, _U_CLOCK, _U_MEM_TEMP, _U_HOT) = range(8, 14)


class UnknownNodeError(KeyError):
    """The scenario has no node of that name."""

    def __init__(self, node: str, known: list[str]) -> None:
        shown = ", ".join(known[:6]) + (f", ... ({len(known)} in all)" if len(known) > 6 else "")
        self.node = node
        self.message = f"unknown node {node!r} (the scenario has {shown})"
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


class _EnergyLedger:
    """Running sum of a context's nominal power, one entry per step, extended on demand (thread-safe)."""

    def __init__(self, power_at: Callable[[int], float], last_step: int, step_s: float) -> None:
        self._power_at = power_at
        self._last = last_step  # from this step on the power no longer changes
        self._step = step_s
        self._prefix = array("d", [0.0])
        self._tail_watts = power_at(last_step)
        self._lock = threading.Lock()

    def joules(self, k: int) -> float:
        """Energy from the scenario's start to the start of step ``k`` (negative before the start)."""
        if k <= 0:
            return k * self._step * self._power_at(-1)
        upto = min(k, self._last)
        with self._lock:
            prefix = self._prefix
            for i in range(len(prefix) - 1, upto):
                prefix.append(prefix[i] + self._power_at(i) * self._step)
            done = prefix[upto]
        return done + (k - upto) * self._tail_watts * self._step


@dataclass(slots=True, eq=False)
class _Context:
    """What shapes a GPU's nominal signals; GPUs with equal contexts share one object and one energy ledger."""

    model: GpuModel
    placements: tuple[Placement, ...]
    faults: tuple[tuple[FaultSpec, str], ...]  # with this GPU's role: "self", "job" or "node"
    ledger: _EnergyLedger = dataclasses.field(init=False)


@dataclass(slots=True)
class _GpuState:
    """One GPU during one step, before noise; faults adjust it in place while it is worked out."""

    activity: Activity
    jobs: tuple[JobSpec, ...]
    load: float  # share of the dynamic power range the work asks for
    power_limit_watts: float
    throttle: int
    pcie_generation: int
    pcie_width: int
    clock_share: float = 1.0  # of the max SM clock, while busy
    heat: str = "normal"  # "warm": near the slowdown threshold; "hot": at or above it
    profiling_dead: bool = False
    lost: bool = False
    power_watts: float = 0.0


@dataclass(slots=True, eq=False)
class _Gpu:
    """A GPU's identity and its static quirks."""

    ref: GpuRef
    uuid: str
    pci_bus_id: str
    model: GpuModel
    context: _Context
    noise_key: bytes
    temperature_offset: float
    base_energy_joules: float
    ecc_corrected: int
    remapped_correctable: int
    pcie_replays: int
    pids: dict[str, int]
    links: tuple[tuple[int, float, str], ...]  # NVLink index, its share of the traffic, the far end's PCI bus id
    idle_links: tuple[LinkReading, ...] | None = None  # built when first needed, then reused


class SimCluster:
    """Every node of a scenario, readable at any virtual time."""

    def __init__(
        self, scenario: Scenario, *, stamp: Callable[[float], float] | None = None, counter_scale: float = 1.0
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
        self._contexts: dict[tuple[object, ...], _Context] = {}
        self._jobs_on: dict[GpuRef, list[JobSpec]] = {}
        self._local_gpus: dict[tuple[str, str], list[GpuRef]] = {}
        for job in scenario.jobs:
            for ref in job.gpus:
                self._jobs_on.setdefault(ref, []).append(job)
                self._local_gpus.setdefault((job.id, ref.node), []).append(ref)
        self._job_nodes = {job.id: len({g.node for g in job.gpus}) for job in scenario.jobs}
        self._nodes = {n.name: [self._gpu(n, i) for i in range(n.gpus)] for n in scenario.nodes}
        self._node_down = {
            n.name: tuple(f for f in scenario.faults if f.kind == "exporter_down" and f.node == n.name)
            for n in scenario.nodes
        }
        self._last: dict[str, tuple[int, NodeSnapshot]] = {}

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
                raise NodeUnavailableError(f"{node}: the exporter is down (simulated exporter_down until {until})")
        cached = self._last.get(node)
        if cached is not None and cached[0] == k:
            return cached[1]
        snap = self._build(node, gpus, k, ts if self._stamp is None else self._stamp(ts))
        self._last[node] = (k, snap)
        return snap

    # ------------------------------------------------------------------------------------------ set-up

    def _job_faults(self, job: JobSpec) -> tuple[FaultSpec, ...]:
        """Faults that act through the job's phases: job-scoped ones and stragglers among its GPUs."""
        return tuple(f for f in self._scenario.faults if f.job == job.id)

    def _gpu(self, node: NodeSpec, index: int) -> _Gpu:
        ref = GpuRef(node.name, index)
        seed = self._scenario.seed
        model = node.model
        uuid_hex = noise.key("uuid", node.name, index).hex()
        uuid = f"GPU-{uuid_hex[:8]}-{uuid_hex[8:12]}-{uuid_hex[12:16]}-{uuid_hex[16:20]}-{uuid_hex[20:32]}"
        context = self._context(node, ref)
        static_key = noise.key(seed, "static", ref)
        u_static = noise.draw(static_key, 0)
        u_links = noise.draw(static_key, 1)
        weights = [1.0 + noise.spread(u_links[link], 0.04) for link in range(model.nvlink_links)]
        total = sum(weights) or 1.0
        switches = self._switch_bus_ids(model)
        return _Gpu(
            ref=ref,
            uuid=uuid,
            pci_bus_id=_pci_bus_id(index),
            model=model,
            context=context,
            noise_key=noise.key(seed, "gpu", node.name, index),
            temperature_offset=noise.spread(u_static[0], 2.5),
            base_energy_joules=(3 + 37 * u_static[1]) * 86400.0 * model.idle_power_watts,
            ecc_corrected=int(40 * u_static[2]) if u_static[3] < 0.1 else 0,
            remapped_correctable=1 if u_static[4] < 0.03 else 0,
            pcie_replays=int(6 * u_static[5]) if u_static[6] < 0.2 else 0,
            pids=self._pids(ref),
            links=tuple(
                (link, w / total, remote) for link, (w, remote) in enumerate(zip(weights, switches, strict=True))
            ),
        )

    @staticmethod
    @functools.cache
    def _switch_bus_ids(model: GpuModel) -> tuple[str, ...]:
        """The PCI bus id of the NVSwitch at the far end of each NVLink."""
        return tuple(
            f"00000000:{0x05 + link * model.nvswitches // model.nvlink_links:02X}:00.0"
            for link in range(model.nvlink_links)
        )

    def _pids(self, ref: GpuRef) -> dict[str, int]:
        pids: dict[str, int] = {}
        for job in self._jobs_on.get(ref, []):
            base = 2000 + int(noise.unit("pid", ref.node, job.id) * 4_000_000)
            pids[job.id] = base + self._local_gpus[job.id, ref.node].index(ref)
        return pids

    def _context(self, node: NodeSpec, ref: GpuRef) -> _Context:
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
        context = _Context(node.model, placements, faults)
        static = not placements and not faults
        context.ledger = _EnergyLedger(
            lambda k: self._state(context, k).power_watts, 0 if static else self._last_step, self._step
        )
        self._contexts[key] = context
        return context

    @staticmethod
    def _role(fault: FaultSpec, ref: GpuRef, jobs: list[JobSpec]) -> str | None:
        if fault.gpu == ref:
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

    def _state(self, ctx: _Context, k: int) -> _GpuState:
        t = self.step_time(k)
        model = ctx.model
        active = [(f, role) for f, role in ctx.faults if f.active(t)] if ctx.faults else []
        role = _straggler_role(active) if active else None
        acts: list[Activity] = []
        jobs: list[JobSpec] = []
        for place in ctx.placements:
            phase = self._phase(place.job.id, k)
            if phase is not None:
                acts.append(activity(phase, place, role))
                jobs.append(place.job)
        act = combine(acts) if acts else idle_activity()
        state = _GpuState(
            activity=act,
            jobs=tuple(jobs),
            load=act.load,
            power_limit_watts=model.board_power_watts,
            throttle=0 if act.busy else _IDLE,
            pcie_generation=model.pcie_generation,
            pcie_width=model.pcie_width,
        )
        for fault, fault_role in active:
            if fault_role != "job":  # job-scoped faults and a straggler's peers act through the job's phase
                _apply_fault(state, fault, t, model)
        power = model.idle_power_watts + state.load * (model.board_power_watts - model.idle_power_watts)
        if power > state.power_limit_watts:
            state.clock_share = min(state.clock_share, math.sqrt(state.power_limit_watts / power))
            power = state.power_limit_watts
            state.throttle |= _SW_POWER_CAP
        state.power_watts = power
        return state

    def _build(self, node: str, gpus: list[_Gpu], k: int, ts: float) -> NodeSnapshot:
        readings: list[GpuReading] = []
        links: list[LinkReading] = []
        processes: list[ProcessReading] = []
        jobs: list[GpuJob] = []
        for gpu in gpus:
            state = self._state(gpu.context, k)
            jobs.extend(GpuJob(node, gpu.ref.index, gpu.uuid, j.id, j.user) for j in state.jobs)
            if state.lost:
                readings.append(
                    GpuReading(
                        node=node,
                        gpu=gpu.ref.index,
                        uuid=gpu.uuid,
                        model=gpu.model.product_name,
                        timestamp=ts,
                        up=False,
                        pci_bus_id=gpu.pci_bus_id,
                    )
                )
                continue
            reading = self._reading(gpu, k, ts, state)
            readings.append(reading)
            links.extend(self._links(gpu, reading))
            processes.extend(self._processes(gpu, state, reading))
        return NodeSnapshot(
            node=node,
            timestamp=ts,
            source=SOURCE_NAME,
            gpus=tuple(readings),
            links=tuple(links),
            processes=tuple(processes),
            jobs=tuple(jobs),
            driver_version=DRIVER_VERSION,
        )

    def _reading(self, gpu: _Gpu, k: int, ts: float, state: _GpuState) -> GpuReading:
        u = noise.draw(gpu.noise_key, k)
        act = state.activity
        model = gpu.model
        capped = bool(state.throttle & _SW_POWER_CAP)
        if capped:
            power = state.power_limit_watts * (1.0 - 0.01 * u[_U_POWER])
        else:
            power = min(state.power_limit_watts, state.power_watts * (1.0 + noise.spread(u[_U_POWER], 0.025)))
        temperature = self._temperature(gpu, state.heat, power, u)
        pcie_max = pcie_max_bytes_per_second(state.pcie_generation, state.pcie_width)
        nvlink_max = model.nvlink_max_bytes_per_second
        crc, replay, recovery, pcie_replays, xids = self._counters(gpu, ts)
        if act.busy:
            sm_clock = round(model.max_sm_clock_hertz * state.clock_share / _MHZ - 15 * u[_U_CLOCK]) * _MHZ
            memory_clock = model.max_memory_clock_hertz
        else:
            sm_clock = model.idle_sm_clock_hertz
            memory_clock = model.idle_memory_clock_hertz
        sm, tensor, dram = (0.0, 0.0, 0.0) if state.profiling_dead else self._profiling(act, u)
        return GpuReading(
            node=gpu.ref.node,
            gpu=gpu.ref.index,
            uuid=gpu.uuid,
            model=model.product_name,
            timestamp=ts,
            up=True,
            pci_bus_id=gpu.pci_bus_id,
            driver_version=DRIVER_VERSION,
            mig_enabled=False,
            utilization_ratio=round(_clamp(act.utilization + noise.spread(u[_U_UTIL], 0.015)), 2),
            memory_used_bytes=self._memory_used(model, act, u[_U_MEMORY]),
            memory_total_bytes=model.memory_total_bytes,
            memory_reserved_bytes=model.memory_reserved_bytes,
            temperature_celsius=float(round(temperature)),
            memory_temperature_celsius=(
                None
                if model.memory_temperature_offset_celsius is None
                else float(round(temperature + model.memory_temperature_offset_celsius + 2 * u[_U_MEM_TEMP]))
            ),
            slowdown_temperature_celsius=model.slowdown_temperature_celsius,
            power_watts=round(power, 3),
            power_limit_watts=state.power_limit_watts,
            energy_joules_total=round(
                max(0.0, gpu.base_energy_joules + gpu.context.ledger.joules(k) * self._counter_scale), 3
            ),
            sm_clock_hertz=sm_clock,
            memory_clock_hertz=memory_clock,
            max_sm_clock_hertz=model.max_sm_clock_hertz,
            max_memory_clock_hertz=model.max_memory_clock_hertz,
            throttle_reasons=state.throttle,
            pcie_tx_bytes_per_second=_rate(act.pcie_tx, pcie_max, u[_U_PCIE_TX], 0.08, 1000.0),
            pcie_rx_bytes_per_second=_rate(act.pcie_rx, pcie_max, u[_U_PCIE_RX], 0.08, 1000.0),
            pcie_link_generation=state.pcie_generation,
            pcie_link_generation_max=model.pcie_generation,
            pcie_link_width=state.pcie_width,
            pcie_link_width_max=model.pcie_width,
            pcie_replays_total=pcie_replays,
            nvlink_tx_bytes_per_second=_rate(act.nvlink, nvlink_max, u[_U_NVL_TX], 0.03, 1024.0)
            if model.has_nvlink
            else None,
            nvlink_rx_bytes_per_second=_rate(act.nvlink, nvlink_max, u[_U_NVL_RX], 0.03, 1024.0)
            if model.has_nvlink
            else None,
            nvlink_links_active=model.nvlink_links,
            nvlink_crc_flit_errors_total=crc,
            nvlink_replay_errors_total=replay,
            nvlink_recovery_errors_total=recovery,
            ecc_corrected_errors_total=gpu.ecc_corrected,
            ecc_uncorrected_errors_total=0,
            remapped_rows_correctable=gpu.remapped_correctable,
            remapped_rows_uncorrectable=0,
            remapped_rows_pending=False,
            remapped_rows_failure=False,
            sm_active_ratio=sm,
            tensor_active_ratio=tensor,
            dram_active_ratio=dram,
            xid_errors=xids,
        )

    @staticmethod
    def _temperature(gpu: _Gpu, heat: str, power: float, u: tuple[float, ...]) -> float:
        model = gpu.model
        slowdown = model.slowdown_temperature_celsius
        if heat == "hot":
            return slowdown + 1.0 + 2.0 * u[_U_HOT]
        share = (power - model.idle_power_watts) / (model.board_power_watts - model.idle_power_watts)
        rise = model.load_temperature_celsius - model.idle_temperature_celsius
        normal = model.idle_temperature_celsius + rise * share + gpu.temperature_offset + noise.spread(u[_U_TEMP], 0.6)
        if heat == "warm":
            return max(normal, slowdown - 4.0 + 1.5 * u[_U_HOT])
        return normal

    @staticmethod
    def _profiling(act: Activity, u: tuple[float, ...]) -> tuple[float, float, float]:
        return (
            round(_clamp(act.sm_active * (1.0 + noise.spread(u[_U_SM], 0.04))), 4),
            round(_clamp(act.tensor_active * (1.0 + noise.spread(u[_U_TENSOR], 0.04))), 4),
            round(_clamp(act.dram_active * (1.0 + noise.spread(u[_U_DRAM], 0.04))), 4),
        )

    @staticmethod
    def _memory_used(model: GpuModel, act: Activity, u: float) -> int:
        share = act.memory_fraction + (noise.spread(u, 0.002) if act.memory_jitter and act.memory_fraction else 0.0)
        used = int(model.memory_total_bytes * max(0.0, share)) // _MIB * _MIB + _IDLE_MEMORY_BYTES
        return min(used, model.memory_total_bytes - model.memory_reserved_bytes)

    def _counters(self, gpu: _Gpu, ts: float) -> tuple[int | None, int | None, int | None, int, dict[int, int]]:
        has_nvlink = gpu.model.has_nvlink
        crc = replay = recovery = 0
        pcie_replays = gpu.pcie_replays
        xids: dict[int, int] = {}
        for fault, role in gpu.context.faults:
            if role != "self" or ts < fault.start:
                continue
            elapsed = (min(ts, fault.end) - fault.start) * self._counter_scale
            if fault.kind == "nvlink_errors":
                crc += int(NVLINK_CRC_PER_S * elapsed)
                replay += int(NVLINK_REPLAY_PER_S * elapsed)
                recovery += int(NVLINK_RECOVERY_PER_S * elapsed)
            elif fault.kind == "pcie_degraded":
                pcie_replays += int(DEGRADED_PCIE_REPLAYS_PER_S * elapsed)
            elif fault.kind == "xid" and fault.xid is not None:
                xids[fault.xid] = xids.get(fault.xid, 0) + 1
        if not has_nvlink:
            return None, None, None, pcie_replays, xids
        return crc, replay, recovery, pcie_replays, xids

    @staticmethod
    def _links(gpu: _Gpu, reading: GpuReading) -> Sequence[LinkReading]:
        tx = reading.nvlink_tx_bytes_per_second or 0.0
        rx = reading.nvlink_rx_bytes_per_second or 0.0
        node, index, uuid = gpu.ref.node, gpu.ref.index, gpu.uuid
        if not tx and not rx:
            if gpu.idle_links is None:
                gpu.idle_links = tuple(
                    LinkReading(node, index, uuid, link, True, 0.0, 0.0, remote) for link, _, remote in gpu.links
                )
            return gpu.idle_links
        return [
            LinkReading(node, index, uuid, link, True, tx * share, rx * share, remote)
            for link, share, remote in gpu.links
        ]

    @staticmethod
    def _processes(gpu: _Gpu, state: _GpuState, reading: GpuReading) -> list[ProcessReading]:
        holders = [j for j in state.jobs if j.memory_fraction > 0]
        if not holders:
            return []
        in_use = (reading.memory_used_bytes or 0) - _IDLE_MEMORY_BYTES
        weight = sum(j.memory_fraction for j in holders)
        return [
            ProcessReading(
                node=gpu.ref.node,
                gpu=gpu.ref.index,
                uuid=gpu.uuid,
                pid=gpu.pids[j.id],
                memory_used_bytes=max(_PROCESS_MIN_BYTES, int(in_use * j.memory_fraction / weight) // _MIB * _MIB),
                command=_COMMANDS[j.kind],
                user=j.user,
                job_id=j.id,
            )
            for j in holders
        ]


def _pci_bus_id(index: int) -> str:
    """An HGX board's bus ids for the first eight GPUs; devices on one extra bus beyond."""
    if index < len(_HGX_BUS):
        return f"00000000:{_HGX_BUS[index]:02X}:00.0"
    return f"00000000:{0xE0 + index // 32:02X}:{index % 32:02X}.0"


def _straggler_role(active: list[tuple[FaultSpec, str]]) -> str | None:
    """ "straggler" on the slow GPU and "peer" on its job's other GPUs while a straggler fault acts."""
    for fault, role in active:
        if fault.kind == "straggler":
            return "straggler" if role == "self" else "peer"
    return None


def _apply_fault(state: _GpuState, fault: FaultSpec, t: float, model: GpuModel) -> None:
    """What a GPU- or node-scoped fault does to one GPU during one step (counters are ``_counters``'s)."""
    kind = fault.kind
    if kind == "thermal_throttle":
        state.throttle |= _THERMAL
        state.clock_share = min(state.clock_share, THERMAL_CLOCK_SHARE)
        state.load *= 0.65
        state.heat = "hot"
    elif kind == "straggler":
        state.throttle |= _SW_THERMAL
        state.clock_share = min(state.clock_share, STRAGGLER_CLOCK_SHARE)
        if state.heat != "hot":
            state.heat = "warm"
    elif kind == "power_cap":
        state.power_limit_watts = POWER_CAP_SHARE * model.board_power_watts
    elif kind == "pcie_degraded":
        state.pcie_generation = 3 if model.pcie_generation > 3 else model.pcie_generation - 1
        state.pcie_width = 8
    elif kind == "pcie_saturation":
        state.activity.pcie_tx = state.activity.pcie_rx = PCIE_SATURATION_SHARE
    elif kind == "memory_leak":
        state.activity.memory_fraction = _leaked(fault, t, state.activity.memory_fraction, model)
    elif kind == "dead_profiling":
        state.profiling_dead = True
    elif kind == "gpu_lost":
        state.lost = True


def _leaked(fault: FaultSpec, t: float, base: float, model: GpuModel) -> float:
    """Memory share during a leak: climbs from the job's level to ``LEAK_TARGET_SHARE`` over the window."""
    usable = (model.memory_total_bytes - model.memory_reserved_bytes) / model.memory_total_bytes - 0.002
    target = max(base, min(LEAK_TARGET_SHARE, usable))
    progress = min(1.0, (t - fault.start) / (0.9 * (fault.end - fault.start)))
    return base + (target - base) * progress


def _rate(share: float, ceiling: float, u: float, jitter: float, quantum: float) -> float:
    """A throughput: ``share`` of ``ceiling`` with multiplicative noise, below the ceiling, in whole quanta."""
    value = min(0.99 * ceiling, share * ceiling * (1.0 + noise.spread(u, jitter)))
    return float(int(value / quantum) * quantum)


def _clamp(x: float) -> float:
    return 0.0 if x < 0.0 else 1.0 if x > 1.0 else x
