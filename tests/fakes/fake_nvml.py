"""A fake of the ``pynvml`` functions that ``gpulens.exporter.nvml.NvmlSource`` calls, injected with ``nvml=``.

It raises real pynvml errors (``pynvml.NVMLError(code)`` becomes the matching ``NVMLError_*`` subclass) and returns
real pynvml ctypes structures where pynvml does, so the source is tested against the library's true shapes. Each
GPU is a ``FakeGpu`` whose values tests set directly; counters (energy, NVLink KiB) advance with the fake's clock.
Failures are injected per GPU and function (``fail``), per field (``fail_field``), per driver (``remove_function``,
as an older driver without a C symbol) and per GPU (``lose``). Every call is recorded, with how many ran at once.
GPM (``nvmlGpm*``, Hopper and newer) lives in ``tests.fakes.fake_gpm``; ``h200_gpu`` is a GPU that supports it.
"""

from __future__ import annotations

import ctypes
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pynvml
from pynvml import (
    NVML_CLOCK_MEM,
    NVML_CLOCK_SM,
    NVML_DEVICE_MIG_DISABLE,
    NVML_DEVICE_MIG_ENABLE,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_TIMEOUT,
    NVML_ERROR_UNINITIALIZED,
    NVML_FEATURE_DISABLED,
    NVML_FEATURE_ENABLED,
    NVML_FI_DEV_MEMORY_TEMP,
    NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
    NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
    NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
    NVML_MEMORY_ERROR_TYPE_CORRECTED,
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
    NVML_NVLINK_MAX_LINKS,
    NVML_PCIE_UTIL_RX_BYTES,
    NVML_PCIE_UTIL_TX_BYTES,
    NVML_SUCCESS,
    NVML_TEMPERATURE_GPU,
    NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
    NVML_VALUE_TYPE_UNSIGNED_INT,
    NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
    NVML_VOLATILE_ECC,
    NVML_VALUE_NOT_AVAILABLE_ulonglong,
    nvmlEventTypeXidCriticalError,
    nvmlMemory_v2,
)

from gpulens.clock import Clock, ManualClock
from tests.fakes.fake_gpm import FakeGpmMixin, GpmCounts

__all__ = [
    "GIB",
    "MIB",
    "NVML_CLOCK_MEM",
    "NVML_CLOCK_SM",
    "NVML_ERROR_GPU_IS_LOST",
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_FI_DEV_MEMORY_TEMP",
    "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX",
    "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX",
    "NVML_NVLINK_MAX_LINKS",
    "NVML_PCIE_UTIL_RX_BYTES",
    "NVML_PCIE_UTIL_TX_BYTES",
    "NVML_TEMPERATURE_GPU",
    "FakeGpu",
    "FakeMig",
    "FakeNvml",
    "h100_gpu",
    "h200_gpu",
    "l40s_gpu",
    "nvmlEventTypeXidCriticalError",
]

MIB = 1024**2
GIB = 1024**3
ALL_LINKS = 0xFFFFFFFF
_T = TypeVar("_T")
_ERROR_TOTALS = (
    NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
    NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
    NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
)

# HGX H100 8-GPU baseboard PCI bus numbers, in NVML index order.
_HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


@dataclass
class FakeMig:
    """A MIG device (GPU instance + compute instance)."""

    uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    memory_total: int
    memory_used: int


@dataclass
class FakeGpu:
    """One fake GPU, in NVML's own units: bytes, percent, °C, mW, mJ, MHz, KB/s (PCIe), KiB (NVLink)."""

    uuid: str
    name: str
    pci_bus_id: str
    memory_total: int
    memory_used: int
    memory_reserved: int
    utilization: int = 0
    memory_utilization: int = 0
    encoder_utilization: int = 0
    decoder_utilization: int = 0
    temperature: int = 40
    memory_temperature: int = 45
    slowdown_temperature: int = 87
    power_mw: int = 100_000
    power_limit_mw: int = 700_000
    energy_mj: float = 0  # cumulative; grows by power_mw every second of the fake's clock
    sm_clock_mhz: int = 1980
    memory_clock_mhz: int = 2619
    max_sm_clock_mhz: int = 1980
    max_memory_clock_mhz: int = 2619
    clock_event_reasons: int = 0
    pcie_tx_kbs: int = 0
    pcie_rx_kbs: int = 0
    pcie_generation: int = 5
    pcie_width: int = 16
    pcie_generation_max: int = 5
    pcie_width_max: int = 16
    pcie_replays: int = 0
    nvlinks: int = 0  # 0 for a PCIe-only GPU
    nvlink_inactive: set[int] = field(default_factory=set)
    nvlink_tx_kib_per_s: float = 0.0  # per active link
    nvlink_rx_kib_per_s: float = 0.0
    nvlink_remote_bus_ids: tuple[str, ...] = ()
    nvlink_aggregate: bool = True  # whether the throughput fields answer scopeId 0xFFFFFFFF (the sum over links)
    nvlink_crc_flit_errors: int = 0  # over all links; link l holds an even share (the first links the remainder)
    nvlink_replay_errors: int = 0
    nvlink_recovery_errors: int = 0
    nvlink_error_totals: bool = True  # whether the all-links error fields answer (False: NotSupported, as Hopper may)
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)  # correctable, uncorrectable, pending, failure
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, used bytes or None)
    # GPM (Hopper and newer): SM, tensor and DRAM utilization in percent; GPM's PCIe averages follow pcie_*_kbs.
    gpm_supported: bool = False
    gpm_sm_util: float = 0.0
    gpm_tensor_util: float = 0.0
    gpm_dram_util: float = 0.0
    gpm_unsupported_metrics: set[int] = field(default_factory=set)  # NVML_GPM_METRIC_* ids that answer NotSupported
    persistence_mode: int = NVML_FEATURE_ENABLED
    ecc_mode: int = NVML_FEATURE_ENABLED
    # NVML_GPU_FABRIC_STATE_*; None: the driver answers NotSupported (no NVSwitch fabric). ``fabric_status`` is the
    # nvmlReturn_t the fabric info carries.
    fabric_state: int | None = None
    fabric_status: int = 0
    mig_capable: bool = True
    mig_enabled: bool = False
    mig_slots: int = 7
    migs: list[FakeMig] = field(default_factory=list)
    # Failure injection: function (pynvml name) -> NVML error code; field id -> NVML return code.
    failures: dict[str, int] = field(default_factory=dict)
    field_failures: dict[int, int] = field(default_factory=dict)
    lost_error: int | None = None  # set by FakeNvml.lose()
    # Cumulative NVLink counters per link (KiB), and the clock time the counters were last brought up to date.
    nvlink_tx_kib: list[float] = field(default_factory=list)
    nvlink_rx_kib: list[float] = field(default_factory=list)
    gpm_totals: dict[str, float] = field(default_factory=dict)  # integrals over time: PCIe KiB, utilization %·s
    counters_time: float = 0.0


def h100_gpu(index: int) -> FakeGpu:
    """A busy H100 SXM5 80GB on an HGX board: 18 NVLinks to the NVSwitches.

    GPM is off (``gpm_supported=False``), as on a driver before GPM: its PCIe values come from the 20 ms sample and its
    NVLink values from the field counters. ``h200_gpu`` is a Hopper GPU with GPM.
    """
    bus = _HGX_BUSES[index] if index < len(_HGX_BUSES) else 0x10 + index
    return FakeGpu(
        uuid=f"GPU-{index:08x}-4e1c-9a7b-d1f0-5c3a2b1e{index:04x}",
        name="NVIDIA H100 80GB HBM3",
        pci_bus_id=f"00000000:{bus:02X}:00.0",
        memory_total=81559 * MIB,
        memory_used=70 * GIB,
        memory_reserved=530 * MIB,
        utilization=97,
        memory_utilization=41,
        temperature=61,
        memory_temperature=70,
        slowdown_temperature=87,
        power_mw=612_500,
        power_limit_mw=700_000,
        energy_mj=12_500_000_000,
        sm_clock_mhz=1980,
        memory_clock_mhz=2619,
        max_sm_clock_mhz=1980,
        max_memory_clock_mhz=2619,
        clock_event_reasons=0x4,
        pcie_tx_kbs=1_200_000,
        pcie_rx_kbs=2_400_000,
        pcie_replays=2,
        nvlinks=18,
        nvlink_tx_kib_per_s=10 * 1024 * 1024,
        nvlink_rx_kib_per_s=9 * 1024 * 1024,
        nvlink_remote_bus_ids=tuple(f"00000000:{0x05 + link // 5:02X}:00.0" for link in range(18)),
        nvlink_crc_flit_errors=3,
        nvlink_replay_errors=1,
        ecc_corrected=5,
        remapped_rows=(1, 0, 0, 0),
        processes=[(4000 + index, 70 * GIB)],
        fabric_state=pynvml.NVML_GPU_FABRIC_STATE_COMPLETED,
    )


def h200_gpu(index: int) -> FakeGpu:
    """An H200 SXM 141GB under load with GPM, set to what the issue measured on a real one (driver 580): graphics
    utilization 99 %, SM 95.8 %, any-tensor 93.0 %, DRAM bandwidth 17.8 %, PCIe TX/RX 8,960 / 8,518 MiB/s."""
    gpu = h100_gpu(index)
    gpu.uuid = f"GPU-{index:08x}-2b6f-4c1d-8e3a-7f90a1b2{index:04x}"
    gpu.name = "NVIDIA H200"
    gpu.memory_total = 143771 * MIB
    gpu.memory_used = 120 * GIB
    gpu.utilization = 99
    gpu.pcie_tx_kbs = 8960 * 1024
    gpu.pcie_rx_kbs = 8518 * 1024
    gpu.gpm_supported = True
    gpu.gpm_sm_util = 95.8
    gpu.gpm_tensor_util = 93.0
    gpu.gpm_dram_util = 17.8
    return gpu


def l40s_gpu(index: int) -> FakeGpu:
    """An L40S: PCIe only, no NVLink, no MIG."""
    return FakeGpu(
        uuid=f"GPU-{index:08x}-7d2e-41aa-8c6b-0f9e8d7c{index:04x}",
        name="NVIDIA L40S",
        pci_bus_id=f"00000000:{0x81 + index:02X}:00.0",
        memory_total=46068 * MIB,
        memory_used=12 * GIB,
        memory_reserved=420 * MIB,
        utilization=55,
        power_mw=210_000,
        power_limit_mw=350_000,
        pcie_generation=4,
        pcie_generation_max=4,
        mig_capable=False,
        processes=[(5000 + index, 12 * GIB)],
    )


class _Handle:
    """A real ``c_nvmlDevice_t`` pointer, kept alive together with the opaque struct it points at."""

    def __init__(self) -> None:
        self.target = pynvml.struct_c_nvmlDevice_t()
        self.pointer = pynvml.c_nvmlDevice_t(self.target)
        self.address = ctypes.cast(self.pointer, ctypes.c_void_p).value


class FakeNvml(FakeGpmMixin):
    """Stands in for the ``pynvml`` module: ``NvmlSource(node, nvml=FakeNvml(...))``."""

    def __init__(
        self,
        gpus: Sequence[FakeGpu],
        *,
        clock: Clock | None = None,
        driver_version: str = "550.54.15",
        latency_s: float = 0.0,
        pcie_latency_s: float = 0.0,
        init_error: int | None = None,
    ) -> None:
        self.gpus = list(gpus)
        self.clock = clock or ManualClock()
        self.driver_version = driver_version
        self.latency_s = latency_s
        self.pcie_latency_s = pcie_latency_s
        self.init_error = init_error
        self.event_wait_cap_s = 0.05  # a short wait keeps tests quick; NVML answers Timeout either way
        self.removed: set[str] = set()  # C symbols the "driver" lacks
        self.hangs: dict[str, threading.Event] = {}  # functions that do not return until their event is set
        self.calls: Counter[str] = Counter()
        self.calls_by_gpu: Counter[tuple[str, int]] = Counter()
        self.initialized = False
        self.shutdown_calls = 0
        self.event_sets_freed = 0
        self._lock = threading.Lock()
        self._active: Counter[tuple[str, int | None]] = Counter()
        self._max_active: Counter[tuple[str, int | None]] = Counter()
        self._gpu_handles = [_Handle() for _ in self.gpus]
        self._mig_handles: dict[tuple[int, int], _Handle] = {}
        self._registered: set[int] = set()
        self._events: queue.Queue[tuple[int, int]] = queue.Queue()
        self.gpm = GpmCounts()
        start = self.clock.monotonic()
        for gpu in self.gpus:
            gpu.counters_time = start
            gpu.nvlink_tx_kib = [0.0] * gpu.nvlinks
            gpu.nvlink_rx_kib = [0.0] * gpu.nvlinks

    @classmethod
    def h100_node(cls, gpus: int = 8, **kwargs: Any) -> FakeNvml:
        """An HGX H100 SXM5 node: ``gpus`` H100s, each with 18 NVLinks."""
        return cls([h100_gpu(i) for i in range(gpus)], **kwargs)

    @classmethod
    def h200_node(cls, gpus: int = 8, **kwargs: Any) -> FakeNvml:
        """An HGX H200 node: ``gpus`` H200s with GPM and 18 NVLinks each."""
        return cls([h200_gpu(i) for i in range(gpus)], **kwargs)

    # --- configuration ------------------------------------------------------------------------------------------

    def fail(self, index: int, function: str, code: int) -> None:
        """Make ``function`` (its pynvml name) raise ``NVMLError(code)`` on GPU ``index`` from now on."""
        self.gpus[index].failures[function] = code

    def fail_field(self, index: int, field_id: int, code: int) -> None:
        """Make field ``field_id`` come back from nvmlDeviceGetFieldValues with nvmlReturn ``code``."""
        self.gpus[index].field_failures[field_id] = code

    def remove_function(self, symbol: str) -> None:
        """Act as an older driver without the C function ``symbol``: calls raise NVMLError_FunctionNotFound."""
        self.removed.add(symbol)

    def hang(self, function: str) -> threading.Event:
        """Make ``function`` never return (a wedged driver) until the returned event is set: ``release_hangs``."""
        return self.hangs.setdefault(function, threading.Event())

    def release_hangs(self) -> None:
        """Let every hung call return (tests end with it, so that no thread stays stuck)."""
        for event in self.hangs.values():
            event.set()
        self.hangs.clear()

    def lose(self, index: int, error: int = NVML_ERROR_GPU_IS_LOST) -> None:
        """Make every call on GPU ``index`` raise ``NVMLError(error)`` from now on (it fell off the bus)."""
        self.gpus[index].lost_error = error

    def restore(self, index: int) -> None:
        self.gpus[index].lost_error = None

    def enable_mig(self, index: int, devices: int) -> None:
        """Turn MIG mode on for GPU ``index`` with ``devices`` 1g.10gb MIG devices."""
        gpu = self.gpus[index]
        gpu.mig_enabled = True
        gpu.migs = [
            FakeMig(
                uuid=f"MIG-{index:04x}{n:04x}-5b8e-5c2d-9f31-aa0c7e1d{n:04x}",
                gpu_instance_id=9 + n,
                compute_instance_id=0,
                profile="1g.10gb",
                memory_total=9984 * MIB,
                memory_used=(n + 1) * GIB,
            )
            for n in range(devices)
        ]

    def change(self, index: int, **values: Any) -> None:
        """Set attributes of GPU ``index`` from now on: its counters grow at the old rates up to this moment."""
        gpu = self._advance(index)
        for name, value in values.items():
            if not hasattr(gpu, name):
                raise AttributeError(name)
            setattr(gpu, name, value)

    def reset_counters(self, index: int) -> None:
        """Restart GPU ``index``'s NVLink throughput counters from 0 (as a driver reload does)."""
        gpu = self._advance(index)
        gpu.nvlink_tx_kib = [0.0] * gpu.nvlinks
        gpu.nvlink_rx_kib = [0.0] * gpu.nvlinks

    def xid(self, index: int, code: int) -> None:
        """Deliver an XID event for GPU ``index`` to the event set, if the GPU is registered on it."""
        if index in self._registered:
            self._events.put((index, code))

    def max_concurrent(self, function: str, gpu: int | None = None) -> int:
        """The most calls of ``function`` (on GPU ``gpu``, or on any) that were in flight at the same time."""
        with self._lock:
            return self._max_active[(function, gpu)]

    def _advance(self, index: int) -> FakeGpu:
        """Bring GPU ``index``'s counters up to the clock, at the rates set now (energy, active NVLinks)."""
        gpu = self.gpus[index]
        with self._lock:
            now = self.clock.monotonic()
            elapsed = max(0.0, now - gpu.counters_time)
            gpu.counters_time = now
            gpu.energy_mj += gpu.power_mw * elapsed
            for key, rate in (
                ("pcie_tx_kib", gpu.pcie_tx_kbs),
                ("pcie_rx_kib", gpu.pcie_rx_kbs),
                ("sm_util", gpu.gpm_sm_util),
                ("tensor_util", gpu.gpm_tensor_util),
                ("dram_util", gpu.gpm_dram_util),
            ):
                gpu.gpm_totals[key] = gpu.gpm_totals.get(key, 0.0) + rate * elapsed
            for link in range(gpu.nvlinks):
                if link not in gpu.nvlink_inactive:
                    gpu.nvlink_tx_kib[link] += gpu.nvlink_tx_kib_per_s * elapsed
                    gpu.nvlink_rx_kib[link] += gpu.nvlink_rx_kib_per_s * elapsed
        return gpu

    # --- the call machinery ---------------------------------------------------------------------------------------

    @contextmanager
    def _in_flight(self, function: str, gpu: int | None) -> Iterator[None]:
        keys = [(function, None)] if gpu is None else [(function, None), (function, gpu)]
        with self._lock:
            self.calls[function] += 1
            if gpu is not None:
                self.calls_by_gpu[(function, gpu)] += 1
            for key in keys:
                self._active[key] += 1
                self._max_active[key] = max(self._max_active[key], self._active[key])
        try:
            yield
        finally:
            with self._lock:
                for key in keys:
                    self._active[key] -= 1

    def _call(
        self,
        function: str,
        produce: Callable[[], _T],
        *,
        handle: Any = None,
        symbol: str | None = None,
        latency_s: float | None = None,
    ) -> _T:
        """Run one fake NVML call: record it, raise what the driver would, wait the latency, produce the value."""
        index = None if handle is None else self._index_of(handle)
        with self._in_flight(function, index):
            hung = self.hangs.get(function)
            if hung is not None:
                hung.wait()  # the driver never answers (until a test releases it)
            if (symbol or function) in self.removed:
                raise pynvml.NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
            if not self.initialized:
                raise pynvml.NVMLError(NVML_ERROR_UNINITIALIZED)
            if index is not None:
                gpu = self.gpus[index]
                if gpu.lost_error is not None:
                    raise pynvml.NVMLError(gpu.lost_error)
                if function in gpu.failures:
                    raise pynvml.NVMLError(gpu.failures[function])
            delay = self.latency_s if latency_s is None else latency_s
            if delay:
                time.sleep(delay)
            return produce()

    def _index_of(self, handle: Any) -> int:
        address = ctypes.cast(handle, ctypes.c_void_p).value
        for index, known in enumerate(self._gpu_handles):
            if known.address == address:
                return index
        for (index, _), known in self._mig_handles.items():
            if known.address == address:
                return index
        raise pynvml.NVMLError(NVML_ERROR_INVALID_ARGUMENT)

    def _mig_of(self, handle: Any) -> FakeMig | None:
        address = ctypes.cast(handle, ctypes.c_void_p).value
        for (index, slot), known in self._mig_handles.items():
            if known.address == address:
                return self.gpus[index].migs[slot]
        return None

    def _gpu(self, handle: Any) -> FakeGpu:
        return self.gpus[self._index_of(handle)]

    # --- the pynvml surface ---------------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        hung = self.hangs.get("nvmlInit")
        if hung is not None:
            hung.wait()  # a driver wedged before the exporter started
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown", lambda: None)
        self.initialized = False
        self.shutdown_calls += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return self._call("nvmlSystemGetDriverVersion", lambda: self.driver_version)

    def nvmlDeviceGetCount(self) -> int:
        return self._call("nvmlDeviceGetCount", lambda: len(self.gpus), symbol="nvmlDeviceGetCount_v2")

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        def produce() -> Any:
            if not 0 <= index < len(self.gpus):
                raise pynvml.NVMLError(NVML_ERROR_INVALID_ARGUMENT)
            if self.gpus[index].lost_error is not None:
                raise pynvml.NVMLError(self.gpus[index].lost_error)
            return self._gpu_handles[index].pointer

        return self._call("nvmlDeviceGetHandleByIndex", produce, symbol="nvmlDeviceGetHandleByIndex_v2")

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        def produce() -> str:
            mig = self._mig_of(handle)
            return self._gpu(handle).uuid if mig is None else mig.uuid

        return self._call("nvmlDeviceGetUUID", produce, handle=handle)

    def nvmlDeviceGetName(self, handle: Any) -> str:
        def produce() -> str:
            mig = self._mig_of(handle)
            name = self._gpu(handle).name
            return name if mig is None else f"{name} MIG {mig.profile}"

        return self._call("nvmlDeviceGetName", produce, handle=handle)

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        def produce() -> Any:
            info = pynvml.nvmlPciInfo_t()
            info.busId = self._gpu(handle).pci_bus_id
            return info

        return self._call("nvmlDeviceGetPciInfo", produce, handle=handle, symbol="nvmlDeviceGetPciInfo_v3")

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock_type: int) -> int:
        gpu = self._gpu(handle)
        clocks = {NVML_CLOCK_SM: gpu.max_sm_clock_mhz, NVML_CLOCK_MEM: gpu.max_memory_clock_mhz}
        return self._call("nvmlDeviceGetMaxClockInfo", lambda: _pick(clocks, clock_type), handle=handle)

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        gpu = self._gpu(handle)
        clocks = {NVML_CLOCK_SM: gpu.sm_clock_mhz, NVML_CLOCK_MEM: gpu.memory_clock_mhz}
        return self._call("nvmlDeviceGetClockInfo", lambda: _pick(clocks, clock_type), handle=handle)

    def nvmlDeviceGetTemperatureThreshold(self, handle: Any, threshold: int) -> int:
        values = {NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: self._gpu(handle).slowdown_temperature}
        return self._call("nvmlDeviceGetTemperatureThreshold", lambda: _pick(values, threshold), handle=handle)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        values = {NVML_TEMPERATURE_GPU: self._gpu(handle).temperature}
        return self._call("nvmlDeviceGetTemperature", lambda: _pick(values, sensor), handle=handle)

    def nvmlDeviceGetTemperatureV(self, handle: Any, sensor: int, version: int | None = None) -> int:
        values = {NVML_TEMPERATURE_GPU: self._gpu(handle).temperature}
        return self._call("nvmlDeviceGetTemperatureV", lambda: _pick(values, sensor), handle=handle)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        gen = self._gpu(handle).pcie_generation_max
        return self._call("nvmlDeviceGetMaxPcieLinkGeneration", lambda: gen, handle=handle)

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        return self._call("nvmlDeviceGetMaxPcieLinkWidth", lambda: self._gpu(handle).pcie_width_max, handle=handle)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        gen = self._gpu(handle).pcie_generation
        return self._call("nvmlDeviceGetCurrPcieLinkGeneration", lambda: gen, handle=handle)

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        return self._call("nvmlDeviceGetCurrPcieLinkWidth", lambda: self._gpu(handle).pcie_width, handle=handle)

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return self._call("nvmlDeviceGetPcieReplayCounter", lambda: self._gpu(handle).pcie_replays, handle=handle)

    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> int:
        gpu = self._gpu(handle)
        values = {NVML_PCIE_UTIL_TX_BYTES: gpu.pcie_tx_kbs, NVML_PCIE_UTIL_RX_BYTES: gpu.pcie_rx_kbs}
        return self._call(
            "nvmlDeviceGetPcieThroughput",
            lambda: _pick(values, counter),
            handle=handle,
            latency_s=self.pcie_latency_s,
        )

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        def produce() -> list[int]:
            gpu = self._gpu(handle)
            if not gpu.mig_capable:
                raise pynvml.NVMLError(NVML_ERROR_NOT_SUPPORTED)
            mode = NVML_DEVICE_MIG_ENABLE if gpu.mig_enabled else NVML_DEVICE_MIG_DISABLE
            return [mode, mode]

        return self._call("nvmlDeviceGetMigMode", produce, handle=handle)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        def produce() -> int:
            gpu = self._gpu(handle)
            if not gpu.mig_capable:
                raise pynvml.NVMLError(NVML_ERROR_NOT_SUPPORTED)
            return gpu.mig_slots

        return self._call("nvmlDeviceGetMaxMigDeviceCount", produce, handle=handle)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, slot: int) -> Any:
        def produce() -> Any:
            index = self._index_of(handle)
            gpu = self.gpus[index]
            if not gpu.mig_enabled or not 0 <= slot < gpu.mig_slots:
                raise pynvml.NVMLError(NVML_ERROR_INVALID_ARGUMENT)
            if slot >= len(gpu.migs):
                raise pynvml.NVMLError(NVML_ERROR_NOT_FOUND)
            with self._lock:
                known = self._mig_handles.setdefault((index, slot), _Handle())
            return known.pointer

        return self._call("nvmlDeviceGetMigDeviceHandleByIndex", produce, handle=handle)

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        return self._call("nvmlDeviceGetGpuInstanceId", lambda: self._mig(handle).gpu_instance_id, handle=handle)

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        return self._call(
            "nvmlDeviceGetComputeInstanceId", lambda: self._mig(handle).compute_instance_id, handle=handle
        )

    def _mig(self, handle: Any) -> FakeMig:
        mig = self._mig_of(handle)
        if mig is None:
            raise pynvml.NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return mig

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        def produce() -> Any:
            mig = self._mig_of(handle)
            gpu = self._gpu(handle)
            if mig is not None:
                total, used, reserved = mig.memory_total, mig.memory_used, 0
            else:
                total, used, reserved = gpu.memory_total, gpu.memory_used, gpu.memory_reserved
            if version is None:
                return pynvml.c_nvmlMemory_t(total=total, free=total - used - reserved, used=used)
            if version != nvmlMemory_v2:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
            return pynvml.c_nvmlMemory_v2_t(
                version=version, total=total, reserved=reserved, free=total - used - reserved, used=used
            )

        symbol = "nvmlDeviceGetMemoryInfo" if version is None else "nvmlDeviceGetMemoryInfo_v2"
        return self._call("nvmlDeviceGetMemoryInfo", produce, handle=handle, symbol=symbol)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        def produce() -> Any:
            gpu = self._gpu(handle)
            if gpu.mig_enabled:
                raise pynvml.NVMLError(NVML_ERROR_NOT_SUPPORTED)
            return pynvml.c_nvmlUtilization_t(gpu=gpu.utilization, memory=gpu.memory_utilization)

        return self._call("nvmlDeviceGetUtilizationRates", produce, handle=handle)

    def nvmlDeviceGetEncoderUtilization(self, handle: Any) -> list[int]:
        return self._call(
            "nvmlDeviceGetEncoderUtilization", lambda: [self._gpu(handle).encoder_utilization, 167_000], handle=handle
        )

    def nvmlDeviceGetDecoderUtilization(self, handle: Any) -> list[int]:
        return self._call(
            "nvmlDeviceGetDecoderUtilization", lambda: [self._gpu(handle).decoder_utilization, 167_000], handle=handle
        )

    def nvmlDeviceGetPersistenceMode(self, handle: Any) -> int:
        return self._call("nvmlDeviceGetPersistenceMode", lambda: self._gpu(handle).persistence_mode, handle=handle)

    def nvmlDeviceGetEccMode(self, handle: Any) -> list[int]:
        return self._call(
            "nvmlDeviceGetEccMode", lambda: [self._gpu(handle).ecc_mode, self._gpu(handle).ecc_mode], handle=handle
        )

    def _fabric_info(self, function: str, handle: Any, info: Any, struct: type) -> int:
        """Fill the caller's fabric info struct (passed by reference, as pynvml passes it) like the driver does."""

        def produce() -> int:
            gpu = self._gpu(handle)
            if gpu.fabric_state is None:
                raise pynvml.NVMLError(NVML_ERROR_NOT_SUPPORTED)
            target: Any = ctypes.cast(info, ctypes.POINTER(struct)).contents
            target.state = gpu.fabric_state
            target.status = gpu.fabric_status
            return 0  # NVML_SUCCESS

        return self._call(function, produce, handle=handle)

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, info: Any) -> int:
        return self._fabric_info("nvmlDeviceGetGpuFabricInfoV", handle, info, pynvml.c_nvmlGpuFabricInfoV_t)

    def nvmlDeviceGetGpuFabricInfo(self, handle: Any, info: Any) -> int:
        return self._fabric_info("nvmlDeviceGetGpuFabricInfo", handle, info, pynvml.c_nvmlGpuFabricInfo_t)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._call("nvmlDeviceGetPowerUsage", lambda: self._gpu(handle).power_mw, handle=handle)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return self._call("nvmlDeviceGetEnforcedPowerLimit", lambda: self._gpu(handle).power_limit_mw, handle=handle)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        def produce() -> int:
            return round(self._advance(self._index_of(handle)).energy_mj)

        return self._call("nvmlDeviceGetTotalEnergyConsumption", produce, handle=handle)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        reasons = self._gpu(handle).clock_event_reasons
        return self._call("nvmlDeviceGetCurrentClocksEventReasons", lambda: reasons, handle=handle)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        reasons = self._gpu(handle).clock_event_reasons
        return self._call("nvmlDeviceGetCurrentClocksThrottleReasons", lambda: reasons, handle=handle)

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        def produce() -> int:
            gpu = self._gpu(handle)
            if not gpu.nvlinks:
                raise pynvml.NVMLError(NVML_ERROR_NOT_SUPPORTED)
            if not 0 <= link < NVML_NVLINK_MAX_LINKS:
                raise pynvml.NVMLError(NVML_ERROR_INVALID_ARGUMENT)
            if link >= gpu.nvlinks:
                raise pynvml.NVMLError(NVML_ERROR_NOT_SUPPORTED)
            return int(NVML_FEATURE_DISABLED if link in gpu.nvlink_inactive else NVML_FEATURE_ENABLED)

        return self._call("nvmlDeviceGetNvLinkState", produce, handle=handle)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Any, link: int) -> Any:
        def produce() -> Any:
            gpu = self._gpu(handle)
            if link >= len(gpu.nvlink_remote_bus_ids):
                raise pynvml.NVMLError(NVML_ERROR_NOT_SUPPORTED)
            info = pynvml.nvmlPciInfo_t()
            info.busId = gpu.nvlink_remote_bus_ids[link]
            return info

        return self._call(
            "nvmlDeviceGetNvLinkRemotePciInfo", produce, handle=handle, symbol="nvmlDeviceGetNvLinkRemotePciInfo_v2"
        )

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: int, counter: int) -> int:
        def produce() -> int:
            gpu = self._gpu(handle)
            if not 0 <= link < gpu.nvlinks:
                raise pynvml.NVMLError(NVML_ERROR_INVALID_ARGUMENT if gpu.nvlinks else NVML_ERROR_NOT_SUPPORTED)
            totals = {
                pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: gpu.nvlink_crc_flit_errors,
                pynvml.NVML_NVLINK_ERROR_DL_REPLAY: gpu.nvlink_replay_errors,
                pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: gpu.nvlink_recovery_errors,
            }
            share, remainder = divmod(_pick(totals, counter), gpu.nvlinks)
            return share + (1 if link < remainder else 0)

        return self._call("nvmlDeviceGetNvLinkErrorCounter", produce, handle=handle)

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: Sequence[int | tuple[int, int]]) -> Any:
        def produce() -> Any:
            index = self._index_of(handle)
            self._advance(index)
            values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
            for value, requested in zip(values, field_ids, strict=True):
                field_id, scope = requested if isinstance(requested, tuple) else (requested, 0)
                value.fieldId, value.scopeId = field_id, scope
                value.timestamp = int(self.clock.now() * 1_000_000)
                self._fill_field(index, value, field_id, scope)
            return values

        return self._call("nvmlDeviceGetFieldValues", produce, handle=handle)

    def _fill_field(self, index: int, value: Any, field_id: int, scope: int) -> None:
        gpu = self.gpus[index]
        if field_id in gpu.field_failures:
            value.nvmlReturn = gpu.field_failures[field_id]
            return
        if field_id == NVML_FI_DEV_MEMORY_TEMP:
            value.valueType, value.nvmlReturn = NVML_VALUE_TYPE_UNSIGNED_INT, NVML_SUCCESS
            value.value.uiVal = gpu.memory_temperature
            return
        number = self._nvlink_field(index, field_id, scope)
        if number is None:
            refused = not gpu.nvlinks or (field_id in _ERROR_TOTALS and not gpu.nvlink_error_totals)
            value.nvmlReturn = NVML_ERROR_NOT_SUPPORTED if refused else NVML_ERROR_INVALID_ARGUMENT
            return
        value.valueType, value.nvmlReturn = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, NVML_SUCCESS
        value.value.ullVal = number

    def _nvlink_field(self, index: int, field_id: int, scope: int) -> int | None:
        gpu = self.gpus[index]
        if not gpu.nvlinks:
            return None
        totals = {
            NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: gpu.nvlink_crc_flit_errors,
            NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: gpu.nvlink_replay_errors,
            NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: gpu.nvlink_recovery_errors,
        }
        if field_id in totals:
            return totals[field_id] if gpu.nvlink_error_totals and scope == 0 else None
        counters = {
            NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: gpu.nvlink_tx_kib,
            NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: gpu.nvlink_rx_kib,
        }.get(field_id)
        if counters is None:
            return None
        if scope == ALL_LINKS and not gpu.nvlink_aggregate:
            return None
        if scope != ALL_LINKS and not 0 <= scope < gpu.nvlinks:
            return None
        links = range(gpu.nvlinks) if scope == ALL_LINKS else [scope]
        return int(sum(counters[link] for link in links))

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        def produce() -> int:
            gpu = self._gpu(handle)
            if counter_type != NVML_VOLATILE_ECC:
                raise pynvml.NVMLError(NVML_ERROR_NOT_SUPPORTED)
            counts = {NVML_MEMORY_ERROR_TYPE_CORRECTED: gpu.ecc_corrected}
            counts[NVML_MEMORY_ERROR_TYPE_UNCORRECTED] = gpu.ecc_uncorrected
            return _pick(counts, error_type)

        return self._call("nvmlDeviceGetTotalEccErrors", produce, handle=handle)

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        return self._call("nvmlDeviceGetRemappedRows", lambda: self._gpu(handle).remapped_rows, handle=handle)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        """Like pynvml: a missing _v3 symbol raises NVMLLibraryMismatchError, not an NVMLError (releases before that
        class raise NVMLError_FunctionNotFound)."""
        if "nvmlDeviceGetComputeRunningProcesses_v3" in self.removed:
            with self._in_flight("nvmlDeviceGetComputeRunningProcesses", self._index_of(handle)):
                mismatch = getattr(pynvml, "NVMLLibraryMismatchError", None)
                if mismatch is None:
                    raise pynvml.NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
                raise mismatch("use a versioned function such as ..._v2")
        return self._call("nvmlDeviceGetComputeRunningProcesses", lambda: self._processes(handle), handle=handle)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any) -> list[Any]:
        return self._call("nvmlDeviceGetComputeRunningProcesses_v2", lambda: self._processes(handle), handle=handle)

    def _processes(self, handle: Any) -> list[Any]:
        processes = []
        for pid, used in self._gpu(handle).processes:
            info = pynvml.c_nvmlProcessInfo_t(
                pid=pid, usedGpuMemory=NVML_VALUE_NOT_AVAILABLE_ulonglong.value if used is None else used
            )
            friendly = pynvml.nvmlStructToFriendlyObject(info)
            if friendly.usedGpuMemory == NVML_VALUE_NOT_AVAILABLE_ulonglong.value:
                friendly.usedGpuMemory = None
            processes.append(friendly)
        return processes

    def nvmlEventSetCreate(self) -> Any:
        return self._call("nvmlEventSetCreate", lambda: pynvml.c_nvmlEventSet_t(pynvml.struct_c_nvmlEventSet_t()))

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        def produce() -> None:
            if event_types & nvmlEventTypeXidCriticalError:
                self._registered.add(self._index_of(handle))

        self._call("nvmlDeviceRegisterEvents", produce, handle=handle)

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        def produce() -> Any:
            try:
                index, code = self._events.get(timeout=min(timeout_ms / 1000, self.event_wait_cap_s))
            except queue.Empty:
                raise pynvml.NVMLError(NVML_ERROR_TIMEOUT) from None
            return pynvml.c_nvmlEventData_t(
                device=self._gpu_handles[index].pointer,
                eventType=nvmlEventTypeXidCriticalError,
                eventData=code,
                gpuInstanceId=0xFFFFFFFF,
                computeInstanceId=0xFFFFFFFF,
            )

        return self._call("nvmlEventSetWait_v2", produce)

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._call("nvmlEventSetFree", lambda: None)
        self.event_sets_freed += 1


def _pick(values: dict[int, int], key: int) -> int:
    """The value NVML would give for an enum argument, or InvalidArgument for one the fake does not model."""
    if key not in values:
        raise pynvml.NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return int(values[key])
