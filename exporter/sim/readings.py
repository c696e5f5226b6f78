"""From a GPU's state in one step to its NVML-style records: noise added, ratios turned into bytes, watts, hertz.

Noise is drawn from a hash of (seed, node, GPU, step): each signal has its position in the draw, so a reading does
not depend on the order readings are asked for in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from gpulens.exporter.sim import noise
from gpulens.exporter.sim.clockevents import SW_POWER_CAP
from gpulens.exporter.sim.faults import FAULT_KINDS
from gpulens.exporter.sim.gpus import SimGpu
from gpulens.exporter.sim.models import GpuModel
from gpulens.exporter.sim.stepstate import Activity, Counters, GpuState
from gpulens.hardware import pcie_max_bytes_per_second
from gpulens.model import THROTTLE_REPORTED, GpuReading, LinkReading, ProcessReading

DRIVER_VERSION: Final = "550.127.08"

_MIB: Final = 1 << 20
_MHZ: Final = 1_000_000.0
IDLE_MEMORY_BYTES: Final = _MIB
_PROCESS_MIN_BYTES: Final = 512 * _MIB
_COMMANDS: Final = {"training": "python", "inference": "vllm", "notebook": "python", "idle": "python"}

# Positions of each signal in a GPU's noise draw.
(_U_UTIL, _U_POWER, _U_TEMP, _U_SM, _U_TENSOR, _U_DRAM, _U_NVL_TX, _U_NVL_RX) = range(8)
(_U_PCIE_TX, _U_PCIE_RX, _U_MEMORY, _U_CLOCK, _U_MEM_TEMP, _U_HOT) = range(8, 14)


def lost_reading(gpu: SimGpu, ts: float) -> GpuReading:
    """A GPU that fell off the bus: identity fields only."""
    return GpuReading(
        node=gpu.ref.node,
        gpu=gpu.ref.index,
        uuid=gpu.uuid,
        model=gpu.model.product_name,
        timestamp=ts,
        up=False,
        pci_bus_id=gpu.pci_bus_id,
    )


def gpu_reading(gpu: SimGpu, k: int, t: float, ts: float, state: GpuState, counter_scale: float) -> GpuReading:
    """GPU ``gpu`` at step ``k`` (virtual time ``t``, stamped ``ts``) doing what ``state`` says, with noise."""
    u = noise.draw(gpu.noise_key, k)
    act = state.activity
    model = gpu.model
    capped = bool(state.throttle & SW_POWER_CAP)
    if capped:
        power = state.power_limit_watts * (1.0 - 0.01 * u[_U_POWER])
    else:
        power = min(state.power_limit_watts, state.power_watts * (1.0 + noise.spread(u[_U_POWER], 0.025)))
    temperature = _temperature(gpu, state.heat, power, u)
    pcie_max = pcie_max_bytes_per_second(state.pcie_generation, state.pcie_width)
    assert pcie_max is not None  # the catalogue's and the faults' generations are all known
    nvlink_max = model.nvlink_max_bytes_per_second
    counters = fault_counters(gpu, t, counter_scale)  # fault windows are in virtual time
    has_nvlink = model.has_nvlink
    if act.busy:
        sm_clock = round(model.max_sm_clock_hertz * state.clock_share / _MHZ - 15 * u[_U_CLOCK]) * _MHZ
        memory_clock = model.max_memory_clock_hertz
    else:
        sm_clock = model.idle_sm_clock_hertz
        memory_clock = model.idle_memory_clock_hertz
    sm, tensor, dram = (0.0, 0.0, 0.0) if state.profiling_dead else _profiling(act, u)
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
        memory_used_bytes=_memory_used(model, act, u[_U_MEMORY]),
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
        energy_joules_total=round(max(0.0, gpu.base_energy_joules + gpu.context.ledger.joules(k) * counter_scale), 3),
        sm_clock_hertz=sm_clock,
        memory_clock_hertz=memory_clock,
        max_sm_clock_hertz=model.max_sm_clock_hertz,
        max_memory_clock_hertz=model.max_memory_clock_hertz,
        throttle_reasons=state.throttle,
        throttle_reasons_source=THROTTLE_REPORTED,
        pcie_tx_bytes_per_second=_rate(act.pcie_tx, pcie_max, u[_U_PCIE_TX], 0.08, 1000.0),
        pcie_rx_bytes_per_second=_rate(act.pcie_rx, pcie_max, u[_U_PCIE_RX], 0.08, 1000.0),
        pcie_link_generation=state.pcie_generation,
        pcie_link_generation_max=model.pcie_generation,
        pcie_link_width=state.pcie_width,
        pcie_link_width_max=model.pcie_width,
        pcie_replays_total=gpu.pcie_replays + counters.pcie_replays,
        nvlink_tx_bytes_per_second=_rate(act.nvlink, nvlink_max, u[_U_NVL_TX], 0.03, 1024.0) if has_nvlink else None,
        nvlink_rx_bytes_per_second=_rate(act.nvlink, nvlink_max, u[_U_NVL_RX], 0.03, 1024.0) if has_nvlink else None,
        nvlink_links_active=model.nvlink_links,
        nvlink_crc_flit_errors_total=counters.nvlink_crc if has_nvlink else None,
        nvlink_replay_errors_total=counters.nvlink_replay if has_nvlink else None,
        nvlink_recovery_errors_total=counters.nvlink_recovery if has_nvlink else None,
        ecc_corrected_errors_total=gpu.ecc_corrected,
        ecc_uncorrected_errors_total=0,
        remapped_rows_correctable=gpu.remapped_correctable,
        remapped_rows_uncorrectable=0,
        remapped_rows_pending=False,
        remapped_rows_failure=False,
        sm_active_ratio=sm,
        encoder_utilization_ratio=0.0,  # training and inference jobs do not use the video engines
        decoder_utilization_ratio=0.0,
        tensor_active_ratio=tensor,
        dram_active_ratio=dram,
        xid_errors=counters.xids,
    )


def fault_counters(gpu: SimGpu, t: float, counter_scale: float) -> Counters:
    """What the GPU's own faults have added to its counters by virtual time ``t`` (they keep their values once
    over)."""
    counters = Counters()
    for fault, role in gpu.context.faults:
        if role != "self" or t < fault.start:
            continue
        elapsed = (min(t, fault.end) - fault.start) * counter_scale
        FAULT_KINDS[fault.kind].count(fault, elapsed, counters)
    return counters


def _temperature(gpu: SimGpu, heat: str, power: float, u: tuple[float, ...]) -> float:
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


def _profiling(act: Activity, u: tuple[float, ...]) -> tuple[float, float, float]:
    return (
        round(_clamp(act.sm_active * (1.0 + noise.spread(u[_U_SM], 0.04))), 4),
        round(_clamp(act.tensor_active * (1.0 + noise.spread(u[_U_TENSOR], 0.04))), 4),
        round(_clamp(act.dram_active * (1.0 + noise.spread(u[_U_DRAM], 0.04))), 4),
    )


def _memory_used(model: GpuModel, act: Activity, u: float) -> int:
    share = act.memory_fraction + (noise.spread(u, 0.002) if act.memory_jitter and act.memory_fraction else 0.0)
    used = int(model.memory_total_bytes * max(0.0, share)) // _MIB * _MIB + IDLE_MEMORY_BYTES
    return min(used, model.memory_total_bytes - model.memory_reserved_bytes)


def link_readings(gpu: SimGpu, reading: GpuReading) -> Sequence[LinkReading]:
    """The GPU's NVLinks: its traffic split over them by each link's fixed share."""
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
        LinkReading(node, index, uuid, link, True, tx * share, rx * share, remote) for link, share, remote in gpu.links
    ]


def process_readings(gpu: SimGpu, state: GpuState, reading: GpuReading) -> list[ProcessReading]:
    """One process per job holding memory on the GPU, sharing the used memory by the jobs' memory fractions."""
    holders = [j for j in state.jobs if j.memory_fraction > 0]
    if not holders:
        return []
    in_use = (reading.memory_used_bytes or 0) - IDLE_MEMORY_BYTES
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


def _rate(share: float, ceiling: float, u: float, jitter: float, quantum: float) -> float:
    """A throughput: ``share`` of ``ceiling`` with multiplicative noise, below the ceiling, in whole quanta."""
    value = min(0.99 * ceiling, share * ceiling * (1.0 + noise.spread(u, jitter)))
    return float(int(value / quantum) * quantum)


def _clamp(x: float) -> float:
    return 0.0 if x < 0.0 else 1.0 if x > 1.0 else x
