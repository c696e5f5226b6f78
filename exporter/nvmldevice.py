"""Per-device NVML reads: a GPU's static facts (read once), its dynamic values (memory, utilization, thermal and
power, clocks, PCIe, compute processes) and the values that change rarely (power limit, PCIe replays, ECC and row
remapping: ``SlowValues``, reused for ``SLOW_REFRESH_S``), each converted once to gpulens units.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final, NamedTuple

import pynvml  # noqa: TID251 (the NVML modules are the pynvml choke point)

from gpulens.exporter.nvmlcalls import Calls, as_int, as_text, scaled
from gpulens.exporter.nvmlgpu import KIB, Gpu, SlowValues
from gpulens.model import ProcessReading

MHZ: Final = 1_000_000
MILLI: Final = 1000  # mW per W, mJ per J

_TEMPERATURE_CALLS: Final = ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature")
_CLOCK_EVENT_CALLS: Final = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
_PROCESS_CALLS: Final = ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2")


class Memory(NamedTuple):
    used: int | None = None
    total: int | None = None
    reserved: int | None = None


class Thermal(NamedTuple):
    temperature_celsius: float | None
    power_watts: float | None
    energy_joules_total: float | None
    sm_clock_hertz: float | None
    memory_clock_hertz: float | None
    throttle_reasons: int | None


class PcieLink(NamedTuple):
    generation: int | None
    width: int | None


def read_static(calls: Calls, gpu: Gpu) -> None:
    """Fill in the GPU's identity and fixed limits (NVLink facts are read by ``gpulens.exporter.nvmllinks``)."""
    call, h = calls.call, gpu.handle
    gpu.uuid = as_text(call(gpu, "nvmlDeviceGetUUID", h)) or ""
    gpu.model = as_text(call(gpu, "nvmlDeviceGetName", h)) or ""
    pci = call(gpu, "nvmlDeviceGetPciInfo", h)
    gpu.pci_bus_id = None if pci is None else as_text(pci.busId)
    gpu.max_sm_clock_hertz = scaled(call(gpu, "nvmlDeviceGetMaxClockInfo", h, pynvml.NVML_CLOCK_SM), MHZ)
    gpu.max_memory_clock_hertz = scaled(call(gpu, "nvmlDeviceGetMaxClockInfo", h, pynvml.NVML_CLOCK_MEM), MHZ)
    slowdown = call(gpu, "nvmlDeviceGetTemperatureThreshold", h, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
    gpu.slowdown_temperature_celsius = scaled(slowdown, 1)
    gpu.pcie_link_generation_max = as_int(call(gpu, "nvmlDeviceGetMaxPcieLinkGeneration", h))
    gpu.pcie_link_width_max = as_int(call(gpu, "nvmlDeviceGetMaxPcieLinkWidth", h))
    mig_mode = call(gpu, "nvmlDeviceGetMigMode", h)
    gpu.mig_enabled = None if mig_mode is None else int(mig_mode[0]) == pynvml.NVML_DEVICE_MIG_ENABLE
    if gpu.mig_enabled:
        gpu.mig_slots = as_int(call(gpu, "nvmlDeviceGetMaxMigDeviceCount", h)) or 0


def memory(calls: Calls, gpu: Gpu, handle: Any) -> Memory:
    """Memory of a GPU or MIG device: the v2 call (with the reserved memory) where the driver has it."""
    info = calls.call(
        gpu, "nvmlDeviceGetMemoryInfo", handle, version=pynvml.nvmlMemory_v2, key="nvmlDeviceGetMemoryInfo_v2"
    )
    if info is not None:
        return Memory(int(info.used), int(info.total), int(info.reserved))
    info = calls.call(gpu, "nvmlDeviceGetMemoryInfo", handle)
    return Memory() if info is None else Memory(int(info.used), int(info.total))


def utilization(calls: Calls, gpu: Gpu) -> float | None:
    if gpu.mig_enabled:  # NVML does not measure utilization on a MIG-enabled GPU
        return None
    rates = calls.call(gpu, "nvmlDeviceGetUtilizationRates", gpu.handle)
    return None if rates is None else int(rates.gpu) / 100


def codec_utilization(calls: Calls, gpu: Gpu, function: str) -> float | None:
    """The video encoder's or decoder's busy share (``nvmlDeviceGetEncoderUtilization`` / ``...Decoder...``): NVML
    answers [percent, sampling period in µs]."""
    answer = calls.call(gpu, function, gpu.handle)
    return None if answer is None else int(answer[0]) / 100


def pcie_rate(calls: Calls, gpu: Gpu, counter: int) -> float | None:
    """PCIe throughput in bytes/s; NVML samples it over 20 ms, so this call blocks that long."""
    return scaled(calls.call(gpu, "nvmlDeviceGetPcieThroughput", gpu.handle, counter), KIB)


def thermal(calls: Calls, gpu: Gpu) -> Thermal:
    call, first, h = calls.call, calls.first, gpu.handle
    return Thermal(
        temperature_celsius=scaled(first(gpu, _TEMPERATURE_CALLS, h, pynvml.NVML_TEMPERATURE_GPU), 1),
        power_watts=scaled(call(gpu, "nvmlDeviceGetPowerUsage", h), 1 / MILLI),
        energy_joules_total=scaled(call(gpu, "nvmlDeviceGetTotalEnergyConsumption", h), 1 / MILLI),
        sm_clock_hertz=scaled(call(gpu, "nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_SM), MHZ),
        memory_clock_hertz=scaled(call(gpu, "nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_MEM), MHZ),
        throttle_reasons=as_int(first(gpu, _CLOCK_EVENT_CALLS, h)),
    )


def pcie_link(calls: Calls, gpu: Gpu) -> PcieLink:
    """The current PCIe link (it trains down at idle and back up under load, so it is read every time)."""
    call, h = calls.call, gpu.handle
    return PcieLink(
        generation=as_int(call(gpu, "nvmlDeviceGetCurrPcieLinkGeneration", h)),
        width=as_int(call(gpu, "nvmlDeviceGetCurrPcieLinkWidth", h)),
    )


def slow_values(calls: Calls, gpu: Gpu, now: float) -> SlowValues:
    """The GPU's ``SlowValues``, read again once ``SLOW_REFRESH_S`` has passed since monotonic time ``now`` last did."""
    if gpu.slow is not None and gpu.fresh(gpu.slow[0], now):
        return gpu.slow[1]
    values = _read_slow(calls, gpu)
    gpu.slow = (now, values)
    return values


def _read_slow(calls: Calls, gpu: Gpu) -> SlowValues:
    call, h = calls.call, gpu.handle
    power_limit = scaled(call(gpu, "nvmlDeviceGetEnforcedPowerLimit", h), 1 / MILLI)
    replays = as_int(call(gpu, "nvmlDeviceGetPcieReplayCounter", h))
    corrected = call(
        gpu, "nvmlDeviceGetTotalEccErrors", h, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC
    )
    uncorrected = call(
        gpu, "nvmlDeviceGetTotalEccErrors", h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
    )
    rows = call(gpu, "nvmlDeviceGetRemappedRows", h)
    result = SlowValues(power_limit, replays, as_int(corrected), as_int(uncorrected))
    if rows is None:
        return result
    correctable, uncorrectable, pending, failure = rows
    return dataclasses.replace(
        result,
        rows_correctable=int(correctable),
        rows_uncorrectable=int(uncorrectable),
        rows_pending=bool(pending),
        rows_failure=bool(failure),
    )


def processes(calls: Calls, gpu: Gpu, node: str) -> tuple[ProcessReading, ...]:
    """Compute processes by host PID; the job mapper fills in command, user and job later."""
    found = calls.first(gpu, _PROCESS_CALLS, gpu.handle)
    if found is None:
        return ()
    return tuple(
        ProcessReading(
            node=node,
            gpu=gpu.index,
            uuid=gpu.uuid,
            pid=int(process.pid),
            memory_used_bytes=as_int(process.usedGpuMemory),
        )
        for process in found
    )
