"""The NVML source: every GPU of this node, read through NVIDIA's management library (``pynvml``).

This is the only module of gpulens that imports ``pynvml``. Static facts (identity, maximum clocks and PCIe link,
slowdown temperature, MIG mode, NVLink count) are read once at start-up, dynamic values on every ``read()``. The
GPUs are read in parallel on a persistent thread pool, because some NVML calls block: the PCIe throughput call
samples for 20 ms. Every NVML call goes through one choke point, ``_Calls``, which turns NVML's errors into their
meaning (DOMAIN.md §2). XID errors arrive as NVML events on a daemon thread.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

import pynvml

from gpulens.clock import Clock, SystemClock
from gpulens.logutil import ErrorCounter, LogOnce
from gpulens.model import GpuReading, LinkReading, MigReading, NodeSnapshot, ProcessReading, SourceError

log = logging.getLogger(__name__)

KIB: Final = 1024  # NVML's "KB/s" (PCIe throughput) and "KiB" (NVLink counters) are both 1024 bytes
MHZ: Final = 1_000_000
MILLI: Final = 1000  # mW per W, mJ per J
ALL_LINKS: Final = 0xFFFFFFFF  # the scopeId that asks a per-link field for the sum over all links
XID_WAIT_MS: Final = 500
XID_RETRY_S: Final = 1.0
MAX_WORKERS: Final = 32
LINK_STATE_REFRESH_S: Final = 10.0  # 18 calls per H100 per read otherwise; a link that drops still shows at once as
# a fall in its throughput and a rise in its error counters

_SUCCESS: Final[int] = pynvml.NVML_SUCCESS
_INVALID_ARGUMENT: Final[int] = pynvml.NVML_ERROR_INVALID_ARGUMENT
_NOT_SUPPORTED: Final[int] = pynvml.NVML_ERROR_NOT_SUPPORTED
_NO_PERMISSION: Final[int] = pynvml.NVML_ERROR_NO_PERMISSION
_NOT_FOUND: Final[int] = pynvml.NVML_ERROR_NOT_FOUND
_TIMEOUT: Final[int] = pynvml.NVML_ERROR_TIMEOUT
_FUNCTION_NOT_FOUND: Final[int] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
_GPU_IS_LOST: Final[int] = pynvml.NVML_ERROR_GPU_IS_LOST
_UNKNOWN: Final[int] = pynvml.NVML_ERROR_UNKNOWN

_FI_MEMORY_TEMP: Final[int] = pynvml.NVML_FI_DEV_MEMORY_TEMP
_FI_NVLINK_TX: Final[int] = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
_FI_NVLINK_RX: Final[int] = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
_FI_NVLINK_CRC: Final[int] = pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL
_FI_NVLINK_REPLAY: Final[int] = pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL
_FI_NVLINK_RECOVERY: Final[int] = pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL
_FIELD_NAMES: Final[dict[int, str]] = {
    _FI_MEMORY_TEMP: "NVML_FI_DEV_MEMORY_TEMP",
    _FI_NVLINK_TX: "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX",
    _FI_NVLINK_RX: "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX",
    _FI_NVLINK_CRC: "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    _FI_NVLINK_REPLAY: "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    _FI_NVLINK_RECOVERY: "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
}
_VALUE_MEMBERS: Final[dict[int, str]] = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}

_LINK_END: Final = frozenset({_NOT_SUPPORTED, _INVALID_ARGUMENT})
_QUIET_TIMEOUT: Final = frozenset({_TIMEOUT})
_QUIET_NOT_FOUND: Final = frozenset({_NOT_FOUND})
_TEMPERATURE_CALLS: Final = ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature")
_CLOCK_EVENT_CALLS: Final = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
_PROCESS_CALLS: Final = ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2")

# pynvml raises this (not an NVMLError) when an unversioned call's newest C symbol is missing from an older driver;
# releases of nvidia-ml-py before it existed raise NVMLError_FunctionNotFound there instead.
_LIBRARY_MISMATCH: Final[type[Exception]] = getattr(
    pynvml, "NVMLLibraryMismatchError", pynvml.NVMLError_FunctionNotFound
)

_NO_NVML_HINT: Final = "On a machine without GPUs use --source sim; with a dcgm-exporter use --source dcgm"
_INIT_PROBLEMS: Final[dict[int, str]] = {
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: "NVML library not found (libnvidia-ml.so.1): is the NVIDIA driver installed?",
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "NVIDIA driver not loaded: is the nvidia kernel module loaded (see dmesg)?",
    pynvml.NVML_ERROR_NO_PERMISSION: "no permission to open the GPUs: can this user read and write /dev/nvidia*?",
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: "NVML and the kernel driver differ in version: reboot or reload it.",
}


class _GpuLostError(Exception):
    """Raised by the choke point when NVML says a GPU is gone; it ends that GPU's read."""


def _code(exc: BaseException) -> int:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else _UNKNOWN


def _describe(code: int) -> str:
    return str(pynvml.NVMLError(code))


def _as_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _scaled(value: Any, factor: float) -> float | None:
    return None if value is None else float(value) * factor


def _as_text(value: Any) -> str | None:
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    return value if isinstance(value, str) and value else None


def _address(handle: Any) -> int | None:
    """The address an NVML device handle points at: the same device gives the same address."""
    return ctypes.cast(handle, ctypes.c_void_p).value


def _sum_complete(values: Sequence[float | None]) -> float | None:
    """The sum, or None when there is nothing to sum or any part is unknown."""
    if not values or any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None)


class _CounterRates:
    """Rates of cumulative KiB counters between successive reads; a counter that goes backwards restarts."""

    def __init__(self) -> None:
        self._last: dict[tuple[int, int], tuple[float, float]] = {}

    def rate(self, key: tuple[int, int], kib: float | None, now: float) -> float | None:
        """Bytes per second since the previous value of ``key``; None on the first value or after a reset."""
        if kib is None:
            return None
        previous = self._last.get(key)
        self._last[key] = (kib, now)
        if previous is None or kib < previous[0] or now <= previous[1]:
            return None
        return (kib - previous[0]) * KIB / (now - previous[1])


@dataclass(slots=True)
class _Gpu:
    """One GPU: its handle, the static facts read at start-up, and what successive reads need to remember."""

    index: int
    handle: Any
    uuid: str = ""
    model: str = ""
    pci_bus_id: str | None = None
    max_sm_clock_hertz: float | None = None
    max_memory_clock_hertz: float | None = None
    slowdown_temperature_celsius: float | None = None
    pcie_link_generation_max: int | None = None
    pcie_link_width_max: int | None = None
    mig_enabled: bool | None = None
    mig_slots: int = 0
    links: int = 0
    remote_pci_bus_ids: tuple[str | None, ...] = ()
    fields: tuple[tuple[int, int], ...] = ()
    lost: bool = False
    rates: _CounterRates = field(default_factory=_CounterRates)
    # link -> (when read, NVML state); link states change rarely and cost one call per link, so they are cached.
    link_states: dict[int, tuple[float, Any]] = field(default_factory=dict)


def _field_ids(links: int) -> tuple[tuple[int, int], ...]:
    """The (field id, scope id) pairs read in one nvmlDeviceGetFieldValues call per GPU and read."""
    ids = [(_FI_MEMORY_TEMP, 0)]
    if links:
        ids += [(_FI_NVLINK_CRC, 0), (_FI_NVLINK_REPLAY, 0), (_FI_NVLINK_RECOVERY, 0)]
        ids += [(_FI_NVLINK_TX, ALL_LINKS), (_FI_NVLINK_RX, ALL_LINKS)]
        for link in range(links):
            ids += [(_FI_NVLINK_TX, link), (_FI_NVLINK_RX, link)]
    return tuple(ids)


class _Calls:
    """The one choke point between gpulens and NVML: calls a function and turns its errors into meanings.

    NotSupported: the value is absent. FunctionNotFound (an older driver): absent, logged once and never called
    again, so that an older call can stand in. NoPermission: absent, logged once per function. GpuIsLost, and
    Unknown from a GPU already lost: the GPU is lost (``_GpuLostError`` ends its read). Anything else: absent, counted.
    """

    def __init__(self, nvml: Any, errors: ErrorCounter) -> None:
        self._nvml = nvml
        self._errors = errors
        self._once = LogOnce(log)
        self._missing: set[str] = set()
        self._lock = threading.Lock()

    def attempt(
        self,
        gpu: _Gpu | None,
        name: str,
        *args: Any,
        key: str | None = None,
        quiet: frozenset[int] = frozenset(),
        unsupported: str = "nvml_not_supported",
        **kwargs: Any,
    ) -> tuple[Any, int | None]:
        """Call ``nvml.<name>(*args, **kwargs)``: (result, None) on success, (None, NVML error code) on failure.

        ``key`` names the call where one Python function wraps several C functions (``nvmlDeviceGetMemoryInfo``
        with ``version=``); ``quiet`` lists codes that are an expected answer, neither counted nor logged;
        ``unsupported`` is the reason NotSupported is counted under.
        """
        what = key or name
        if self.is_missing(what):
            return None, _FUNCTION_NOT_FOUND
        function = getattr(self._nvml, name, None)
        if function is None:
            self._function_missing(what)
            return None, _FUNCTION_NOT_FOUND
        try:
            return function(*args, **kwargs), None
        except _LIBRARY_MISMATCH:
            self._function_missing(what)
            return None, _FUNCTION_NOT_FOUND
        except pynvml.NVMLError as exc:
            code = _code(exc)
            self.failed(gpu, what, code, quiet=quiet, unsupported=unsupported)
            return None, code

    def call(self, gpu: _Gpu | None, name: str, *args: Any, **kwargs: Any) -> Any:
        """The result of an NVML call, or None when it failed."""
        return self.attempt(gpu, name, *args, **kwargs)[0]

    def first(self, gpu: _Gpu | None, names: Sequence[str], *args: Any) -> Any:
        """The result of the first of ``names`` (newest first) that the driver has, or None."""
        for name in names:
            value, code = self.attempt(gpu, name, *args)
            if code != _FUNCTION_NOT_FOUND:
                return value
        return None

    def is_missing(self, name: str) -> bool:
        with self._lock:
            return name in self._missing

    def failed(
        self,
        gpu: _Gpu | None,
        what: str,
        code: int,
        *,
        quiet: frozenset[int] = frozenset(),
        unsupported: str = "nvml_not_supported",
    ) -> None:
        """Give a failed call (or field value) its meaning. Raises ``_GpuLostError`` when ``gpu`` is gone."""
        where = "the node" if gpu is None else f"GPU {gpu.index}"
        if code in quiet:
            return
        if code == _NOT_SUPPORTED:
            self._errors.count(unsupported, "NVML: %s is not supported on %s; omitted", what, where, level=logging.INFO)
        elif code == _FUNCTION_NOT_FOUND:
            self._function_missing(what)
        elif code == _NO_PERMISSION:
            self._errors.count("nvml_no_permission")
            self._once(f"permission:{what}", "NVML: no permission for %s on %s; omitted", what, where)
        elif code == _GPU_IS_LOST or (code == _UNKNOWN and gpu is not None and gpu.lost):
            if gpu is None:
                self._errors.count("nvml_gpu_lost", "NVML: %s failed: a GPU is lost", what)
                return
            gpu.lost = True
            raise _GpuLostError(gpu.index)
        else:
            self._errors.count("nvml_error")
            self._once(f"error:{what}:{code}", "NVML: %s failed on %s: %s", what, where, _describe(code))

    def _function_missing(self, name: str) -> None:
        with self._lock:
            self._missing.add(name)
        self._errors.count("nvml_function_not_found")
        self._once(f"missing:{name}", "NVML function %s is not available (older driver?); not called again", name)


class _XidWatcher:
    """Counts XID errors per GPU and XID code, from an NVML event set waited on by a daemon thread."""

    def __init__(self, calls: _Calls, gpus: Sequence[_Gpu]) -> None:
        self._calls = calls
        self._counts: dict[int, dict[int, int]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._by_address: dict[int, int] = {}
        self._once = LogOnce(log)
        self._event_set: Any = calls.call(None, "nvmlEventSetCreate", unsupported="xid_events_unsupported")
        if self._event_set is None:
            return
        for gpu in gpus:
            _, code = calls.attempt(
                None,
                "nvmlDeviceRegisterEvents",
                gpu.handle,
                pynvml.nvmlEventTypeXidCriticalError,
                self._event_set,
                unsupported="xid_events_unsupported",
            )
            address = _address(gpu.handle)
            if code is None and address is not None:
                self._by_address[address] = gpu.index
        if not self._by_address:
            self._free()
            return
        self._thread = threading.Thread(target=self._run, name="gpulens-nvml-xid", daemon=True)
        self._thread.start()

    def counts(self, gpu: int) -> dict[int, int]:
        with self._lock:
            return dict(self._counts.get(gpu, {}))

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=XID_WAIT_MS / 1000 + 5)
            if self._thread.is_alive():
                log.warning("the NVML XID event thread did not stop; leaving its event set allocated")
                return
        if self._event_set is not None:
            self._free()

    def _free(self) -> None:
        self._calls.call(None, "nvmlEventSetFree", self._event_set)
        self._event_set = None

    def _run(self) -> None:
        while not self._stop.is_set():
            data, code = self._calls.attempt(
                None, "nvmlEventSetWait_v2", self._event_set, XID_WAIT_MS, quiet=_QUIET_TIMEOUT
            )
            if code is None:
                self._record(data)
            elif code != _TIMEOUT:
                self._stop.wait(XID_RETRY_S)  # the failure is counted; do not spin on it

    def _record(self, data: Any) -> None:
        if int(data.eventType) != pynvml.nvmlEventTypeXidCriticalError:
            return
        address = _address(data.device)
        gpu = None if address is None else self._by_address.get(address)
        if gpu is None:
            return
        xid = int(data.eventData)
        with self._lock:
            per_gpu = self._counts.setdefault(gpu, {})
            per_gpu[xid] = per_gpu.get(xid, 0) + 1
        self._once(f"xid:{gpu}:{xid}", "XID %d on GPU %d (repeats are counted, not logged)", xid, gpu)


class _Memory(NamedTuple):
    used: int | None = None
    total: int | None = None
    reserved: int | None = None


@dataclass(frozen=True, slots=True)
class _Nvlink:
    """The NVLink part of one GPU's read."""

    links: tuple[LinkReading, ...] = ()
    active: int | None = None
    tx_bytes_per_second: float | None = None
    rx_bytes_per_second: float | None = None


@dataclass(frozen=True, slots=True)
class _GpuRead:
    """Everything one read found on one GPU."""

    reading: GpuReading
    links: tuple[LinkReading, ...] = ()
    processes: tuple[ProcessReading, ...] = ()
    migs: tuple[MigReading, ...] = ()


class NvmlSource:
    """Reads the GPUs of this node through NVML; implements ``gpulens.model.GpuSource``.

    ``nvml`` is the ``pynvml`` module or a stand-in with the same functions (tests use a fake).
    Raises ``SourceError`` when NVML cannot start (no driver, no library, no permission).
    """

    def __init__(
        self,
        node: str,
        *,
        nvml: Any = pynvml,
        clock: Clock | None = None,
        max_workers: int | None = None,
        xid_events: bool = True,
    ) -> None:
        if max_workers is not None and max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self._node = node
        self._clock = clock or SystemClock()
        self._errors = ErrorCounter(log)
        self._calls = _Calls(nvml, self._errors)
        _start_nvml(nvml)
        try:
            self._driver_version = _as_text(self._calls.call(None, "nvmlSystemGetDriverVersion"))
            self._gpus = self._open_gpus()
        except SourceError:
            self._calls.call(None, "nvmlShutdown")
            raise
        workers = max_workers or min(max(len(self._gpus), 1), MAX_WORKERS)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gpulens-nvml")
        # The two PCIe throughput calls of a GPU (20 ms each) overlap with each other and with the GPU's other calls.
        self._pcie_pool = ThreadPoolExecutor(max_workers=2 * workers, thread_name_prefix="gpulens-nvml-pcie")
        self._xids = _XidWatcher(self._calls, self._gpus) if xid_events else None
        self._read_lock = threading.Lock()
        self._closed = False
        log.info("NVML: %d GPU(s), driver %s", len(self._gpus), self._driver_version)

    def read(self) -> NodeSnapshot:
        """Read every GPU now. A lost GPU is reported with ``up=False``; the others are read normally."""
        with self._read_lock:
            if self._closed:
                raise SourceError("the NVML source is closed")
            timestamp = self._clock.now()
            results = list(self._pool.map(functools.partial(self._read_gpu, timestamp=timestamp), self._gpus))
        return NodeSnapshot(
            node=self._node,
            timestamp=timestamp,
            source="nvml",
            gpus=tuple(r.reading for r in results),
            links=tuple(link for r in results for link in r.links),
            processes=tuple(p for r in results for p in r.processes),
            migs=tuple(m for r in results for m in r.migs),
            driver_version=self._driver_version,
            errors=self._errors.snapshot(),
        )

    def close(self) -> None:
        """Stop the XID thread and the thread pools and shut NVML down. Safe to call twice."""
        with self._read_lock:
            if self._closed:
                return
            self._closed = True
        if self._xids is not None:
            self._xids.close()
        self._pool.shutdown(wait=True)
        self._pcie_pool.shutdown(wait=True)
        self._calls.call(None, "nvmlShutdown")

    # --- start-up: the static facts ------------------------------------------------------------------------------

    def _open_gpus(self) -> list[_Gpu]:
        count = _as_int(self._calls.call(None, "nvmlDeviceGetCount"))
        if count is None:
            raise SourceError("NVML started but could not count the GPUs (see the log)")
        return [gpu for gpu in map(self._open_gpu, range(count)) if gpu is not None]

    def _open_gpu(self, index: int) -> _Gpu | None:
        """The GPU with its static facts, or None (logged) when its identity cannot be read."""
        handle = self._calls.call(None, "nvmlDeviceGetHandleByIndex", index)
        gpu = None if handle is None else _Gpu(index, handle)
        if gpu is not None:
            try:
                self._read_static(gpu)
            except _GpuLostError:
                self._errors.count("nvml_gpu_lost")
        if gpu is None or gpu.lost or not gpu.uuid or not gpu.model:
            log.warning("NVML: GPU %d is lost or has no readable identity; it is not monitored", index)
            return None
        return gpu

    def _read_static(self, gpu: _Gpu) -> None:
        call, h = self._calls.call, gpu.handle
        gpu.uuid = _as_text(call(gpu, "nvmlDeviceGetUUID", h)) or ""
        gpu.model = _as_text(call(gpu, "nvmlDeviceGetName", h)) or ""
        pci = call(gpu, "nvmlDeviceGetPciInfo", h)
        gpu.pci_bus_id = None if pci is None else _as_text(pci.busId)
        gpu.max_sm_clock_hertz = _scaled(call(gpu, "nvmlDeviceGetMaxClockInfo", h, pynvml.NVML_CLOCK_SM), MHZ)
        gpu.max_memory_clock_hertz = _scaled(call(gpu, "nvmlDeviceGetMaxClockInfo", h, pynvml.NVML_CLOCK_MEM), MHZ)
        slowdown = call(gpu, "nvmlDeviceGetTemperatureThreshold", h, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
        gpu.slowdown_temperature_celsius = _scaled(slowdown, 1)
        gpu.pcie_link_generation_max = _as_int(call(gpu, "nvmlDeviceGetMaxPcieLinkGeneration", h))
        gpu.pcie_link_width_max = _as_int(call(gpu, "nvmlDeviceGetMaxPcieLinkWidth", h))
        mig_mode = call(gpu, "nvmlDeviceGetMigMode", h)
        gpu.mig_enabled = None if mig_mode is None else int(mig_mode[0]) == pynvml.NVML_DEVICE_MIG_ENABLE
        if gpu.mig_enabled:
            gpu.mig_slots = _as_int(call(gpu, "nvmlDeviceGetMaxMigDeviceCount", h)) or 0
        gpu.links = self._count_links(gpu)
        gpu.remote_pci_bus_ids = tuple(self._remote_pci_bus_id(gpu, link) for link in range(gpu.links))
        gpu.fields = _field_ids(gpu.links)

    def _count_links(self, gpu: _Gpu) -> int:
        """The number of NVLinks: links are numbered from 0 and the first unsupported one ends them."""
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            _, code = self._calls.attempt(gpu, "nvmlDeviceGetNvLinkState", gpu.handle, link, quiet=_LINK_END)
            if code is not None:
                return link
        return int(pynvml.NVML_NVLINK_MAX_LINKS)

    def _remote_pci_bus_id(self, gpu: _Gpu, link: int) -> str | None:
        remote = self._calls.call(gpu, "nvmlDeviceGetNvLinkRemotePciInfo", gpu.handle, link)
        return None if remote is None else _as_text(remote.busId)

    # --- every read: the dynamic values --------------------------------------------------------------------------

    def _read_gpu(self, gpu: _Gpu, timestamp: float) -> _GpuRead:
        was_lost = gpu.lost
        try:
            result = self._read_live(gpu, timestamp)
        except _GpuLostError:
            self._errors.count("nvml_gpu_lost")
            if not was_lost:
                log.warning("GPU %d (%s) is lost (fallen off the bus?): reported down", gpu.index, gpu.uuid)
            return _GpuRead(self._down(gpu, timestamp))
        if was_lost:
            gpu.lost = False
            log.warning("GPU %d (%s) answers again", gpu.index, gpu.uuid)
        return result

    def _down(self, gpu: _Gpu, timestamp: float) -> GpuReading:
        """A lost GPU: its identity, its XID counts, no dynamic values."""
        return GpuReading(
            node=self._node,
            gpu=gpu.index,
            uuid=gpu.uuid,
            model=gpu.model,
            timestamp=timestamp,
            up=False,
            pci_bus_id=gpu.pci_bus_id,
            driver_version=self._driver_version,
            xid_errors=self._xid_counts(gpu),
        )

    def _xid_counts(self, gpu: _Gpu) -> dict[int, int]:
        return {} if self._xids is None else self._xids.counts(gpu.index)

    def _read_live(self, gpu: _Gpu, timestamp: float) -> _GpuRead:
        memory = self._memory(gpu, gpu.handle)  # a lost GPU stops here, before anything runs in parallel
        tx = self._pcie_pool.submit(self._pcie_rate, gpu, pynvml.NVML_PCIE_UTIL_TX_BYTES)
        rx = self._pcie_pool.submit(self._pcie_rate, gpu, pynvml.NVML_PCIE_UTIL_RX_BYTES)
        try:
            utilization = self._utilization(gpu)
            fields, fields_time = self._field_values(gpu)
            nvlink = self._nvlink(gpu, fields, fields_time)
            thermal = self._thermal(gpu)
            link = self._pcie_link(gpu)
            health = self._health(gpu)
            processes = self._processes(gpu)
            migs = self._migs(gpu)
        finally:
            wait((tx, rx))
        reading = GpuReading(
            node=self._node,
            gpu=gpu.index,
            uuid=gpu.uuid,
            model=gpu.model,
            timestamp=timestamp,
            pci_bus_id=gpu.pci_bus_id,
            driver_version=self._driver_version,
            mig_enabled=gpu.mig_enabled,
            utilization_ratio=utilization,
            memory_used_bytes=memory.used,
            memory_total_bytes=memory.total,
            memory_reserved_bytes=memory.reserved,
            temperature_celsius=thermal.temperature_celsius,
            memory_temperature_celsius=_scaled(fields.get((_FI_MEMORY_TEMP, 0)), 1),
            slowdown_temperature_celsius=gpu.slowdown_temperature_celsius,
            power_watts=thermal.power_watts,
            power_limit_watts=thermal.power_limit_watts,
            energy_joules_total=thermal.energy_joules_total,
            sm_clock_hertz=thermal.sm_clock_hertz,
            memory_clock_hertz=thermal.memory_clock_hertz,
            max_sm_clock_hertz=gpu.max_sm_clock_hertz,
            max_memory_clock_hertz=gpu.max_memory_clock_hertz,
            throttle_reasons=thermal.throttle_reasons,
            pcie_tx_bytes_per_second=tx.result(),
            pcie_rx_bytes_per_second=rx.result(),
            pcie_link_generation=link.generation,
            pcie_link_generation_max=gpu.pcie_link_generation_max,
            pcie_link_width=link.width,
            pcie_link_width_max=gpu.pcie_link_width_max,
            pcie_replays_total=link.replays,
            nvlink_tx_bytes_per_second=nvlink.tx_bytes_per_second,
            nvlink_rx_bytes_per_second=nvlink.rx_bytes_per_second,
            nvlink_links_active=nvlink.active,
            nvlink_crc_flit_errors_total=_as_int(fields.get((_FI_NVLINK_CRC, 0))),
            nvlink_replay_errors_total=_as_int(fields.get((_FI_NVLINK_REPLAY, 0))),
            nvlink_recovery_errors_total=_as_int(fields.get((_FI_NVLINK_RECOVERY, 0))),
            ecc_corrected_errors_total=health.ecc_corrected,
            ecc_uncorrected_errors_total=health.ecc_uncorrected,
            remapped_rows_correctable=health.rows_correctable,
            remapped_rows_uncorrectable=health.rows_uncorrectable,
            remapped_rows_pending=health.rows_pending,
            remapped_rows_failure=health.rows_failure,
            xid_errors=self._xid_counts(gpu),
        )
        return _GpuRead(reading, links=nvlink.links, processes=processes, migs=migs)

    def _memory(self, gpu: _Gpu, handle: Any) -> _Memory:
        """Memory of a GPU or MIG device: the v2 call (with the reserved memory) where the driver has it."""
        info = self._calls.call(
            gpu, "nvmlDeviceGetMemoryInfo", handle, version=pynvml.nvmlMemory_v2, key="nvmlDeviceGetMemoryInfo_v2"
        )
        if info is not None:
            return _Memory(int(info.used), int(info.total), int(info.reserved))
        info = self._calls.call(gpu, "nvmlDeviceGetMemoryInfo", handle)
        return _Memory() if info is None else _Memory(int(info.used), int(info.total))

    def _utilization(self, gpu: _Gpu) -> float | None:
        if gpu.mig_enabled:  # NVML does not measure utilization on a MIG-enabled GPU
            return None
        rates = self._calls.call(gpu, "nvmlDeviceGetUtilizationRates", gpu.handle)
        return None if rates is None else int(rates.gpu) / 100

    def _pcie_rate(self, gpu: _Gpu, counter: int) -> float | None:
        """PCIe throughput in bytes/s; NVML samples it over 20 ms, so this call blocks that long."""
        return _scaled(self._calls.call(gpu, "nvmlDeviceGetPcieThroughput", gpu.handle, counter), KIB)

    def _field_values(self, gpu: _Gpu) -> tuple[dict[tuple[int, int], float | None], float]:
        """The GPU's batched field values by (field id, scope id), and the monotonic time they were read."""
        values = self._calls.call(gpu, "nvmlDeviceGetFieldValues", gpu.handle, list(gpu.fields))
        now = self._clock.monotonic()
        if values is None:
            return {}, now
        return {key: self._field_value(gpu, key, value) for key, value in zip(gpu.fields, values, strict=True)}, now

    def _field_value(self, gpu: _Gpu, key: tuple[int, int], value: Any) -> float | None:
        field_id, scope = key
        what = _FIELD_NAMES.get(field_id, f"field {field_id}") + ("" if scope in (0, ALL_LINKS) else f"[{scope}]")
        code = int(value.nvmlReturn)
        member = _VALUE_MEMBERS.get(int(value.valueType)) if code == _SUCCESS else None
        if member is None:
            # Drivers that cannot sum over all links refuse that scope; the per-link counters stand in for it.
            quiet = _LINK_END if scope == ALL_LINKS else frozenset()
            self._calls.failed(gpu, what, _UNKNOWN if code == _SUCCESS else code, quiet=quiet)
            return None
        number = getattr(value.value, member)
        return float(number) if member == "dVal" else int(number)

    def _nvlink(self, gpu: _Gpu, fields: dict[tuple[int, int], float | None], now: float) -> _Nvlink:
        if not gpu.links:
            return _Nvlink()
        links = [self._link(gpu, link, fields, now) for link in range(gpu.links)]
        known = [link for link in links if link is not None]
        return _Nvlink(
            links=tuple(known),
            active=sum(link.active for link in known) if known else None,
            tx_bytes_per_second=self._nvlink_total(
                gpu, _FI_NVLINK_TX, fields, now, [k.tx_bytes_per_second for k in known]
            ),
            rx_bytes_per_second=self._nvlink_total(
                gpu, _FI_NVLINK_RX, fields, now, [k.rx_bytes_per_second for k in known]
            ),
        )

    def _link(
        self, gpu: _Gpu, link: int, fields: dict[tuple[int, int], float | None], now: float
    ) -> LinkReading | None:
        """One NVLink, or None when its state cannot be read."""
        tx = gpu.rates.rate((_FI_NVLINK_TX, link), fields.get((_FI_NVLINK_TX, link)), now)
        rx = gpu.rates.rate((_FI_NVLINK_RX, link), fields.get((_FI_NVLINK_RX, link)), now)
        cached = gpu.link_states.get(link)
        if cached is not None and 0 <= now - cached[0] < LINK_STATE_REFRESH_S:
            state = cached[1]
        else:
            state = self._calls.call(gpu, "nvmlDeviceGetNvLinkState", gpu.handle, link)
            gpu.link_states[link] = (now, state)
        if state is None:
            return None
        return LinkReading(
            node=self._node,
            gpu=gpu.index,
            uuid=gpu.uuid,
            link=link,
            active=int(state) == pynvml.NVML_FEATURE_ENABLED,
            tx_bytes_per_second=tx,
            rx_bytes_per_second=rx,
            remote_pci_bus_id=gpu.remote_pci_bus_ids[link],
        )

    @staticmethod
    def _nvlink_total(
        gpu: _Gpu, field_id: int, fields: dict[tuple[int, int], float | None], now: float, per_link: list[float | None]
    ) -> float | None:
        """A GPU's NVLink rate from the all-links counter, or the sum over its links where that counter is absent."""
        total = fields.get((field_id, ALL_LINKS))
        if total is None:
            return _sum_complete(per_link)
        return gpu.rates.rate((field_id, ALL_LINKS), total, now)

    def _thermal(self, gpu: _Gpu) -> _Thermal:
        call, first, h = self._calls.call, self._calls.first, gpu.handle
        return _Thermal(
            temperature_celsius=_scaled(first(gpu, _TEMPERATURE_CALLS, h, pynvml.NVML_TEMPERATURE_GPU), 1),
            power_watts=_scaled(call(gpu, "nvmlDeviceGetPowerUsage", h), 1 / MILLI),
            power_limit_watts=_scaled(call(gpu, "nvmlDeviceGetEnforcedPowerLimit", h), 1 / MILLI),
            energy_joules_total=_scaled(call(gpu, "nvmlDeviceGetTotalEnergyConsumption", h), 1 / MILLI),
            sm_clock_hertz=_scaled(call(gpu, "nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_SM), MHZ),
            memory_clock_hertz=_scaled(call(gpu, "nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_MEM), MHZ),
            throttle_reasons=_as_int(first(gpu, _CLOCK_EVENT_CALLS, h)),
        )

    def _pcie_link(self, gpu: _Gpu) -> _PcieLink:
        call, h = self._calls.call, gpu.handle
        return _PcieLink(
            generation=_as_int(call(gpu, "nvmlDeviceGetCurrPcieLinkGeneration", h)),
            width=_as_int(call(gpu, "nvmlDeviceGetCurrPcieLinkWidth", h)),
            replays=_as_int(call(gpu, "nvmlDeviceGetPcieReplayCounter", h)),
        )

    def _health(self, gpu: _Gpu) -> _Health:
        call, h = self._calls.call, gpu.handle
        corrected = call(
            gpu, "nvmlDeviceGetTotalEccErrors", h, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC
        )
        uncorrected = call(
            gpu, "nvmlDeviceGetTotalEccErrors", h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
        )
        rows = call(gpu, "nvmlDeviceGetRemappedRows", h)
        health = _Health(_as_int(corrected), _as_int(uncorrected))
        if rows is None:
            return health
        correctable, uncorrectable, pending, failure = rows
        return health._replace(
            rows_correctable=int(correctable),
            rows_uncorrectable=int(uncorrectable),
            rows_pending=bool(pending),
            rows_failure=bool(failure),
        )

    def _processes(self, gpu: _Gpu) -> tuple[ProcessReading, ...]:
        """Compute processes by host PID; the job mapper fills in command, user and job later."""
        processes = self._calls.first(gpu, _PROCESS_CALLS, gpu.handle)
        if processes is None:
            return ()
        return tuple(
            ProcessReading(
                node=self._node,
                gpu=gpu.index,
                uuid=gpu.uuid,
                pid=int(process.pid),
                memory_used_bytes=_as_int(process.usedGpuMemory),
            )
            for process in processes
        )

    def _migs(self, gpu: _Gpu) -> tuple[MigReading, ...]:
        """The MIG devices that exist now (empty slots answer NotFound)."""
        migs = []
        for slot in range(gpu.mig_slots):
            handle = self._calls.call(
                gpu, "nvmlDeviceGetMigDeviceHandleByIndex", gpu.handle, slot, quiet=_QUIET_NOT_FOUND
            )
            mig = None if handle is None else self._mig(gpu, handle)
            if mig is not None:
                migs.append(mig)
        return tuple(migs)

    def _mig(self, gpu: _Gpu, handle: Any) -> MigReading | None:
        call = self._calls.call
        mig_uuid = _as_text(call(gpu, "nvmlDeviceGetUUID", handle))
        gpu_instance = _as_int(call(gpu, "nvmlDeviceGetGpuInstanceId", handle))
        if mig_uuid is None or gpu_instance is None:
            return None
        name = _as_text(call(gpu, "nvmlDeviceGetName", handle)) or ""
        memory = self._memory(gpu, handle)
        return MigReading(
            node=self._node,
            gpu=gpu.index,
            uuid=gpu.uuid,
            mig_uuid=mig_uuid,
            gpu_instance_id=gpu_instance,
            compute_instance_id=_as_int(call(gpu, "nvmlDeviceGetComputeInstanceId", handle)),
            profile=name.partition(" MIG ")[2] or None,  # "NVIDIA H100 80GB HBM3 MIG 1g.10gb" -> "1g.10gb"
            memory_used_bytes=memory.used,
            memory_total_bytes=memory.total,
        )


class _Thermal(NamedTuple):
    temperature_celsius: float | None
    power_watts: float | None
    power_limit_watts: float | None
    energy_joules_total: float | None
    sm_clock_hertz: float | None
    memory_clock_hertz: float | None
    throttle_reasons: int | None


class _PcieLink(NamedTuple):
    generation: int | None
    width: int | None
    replays: int | None


class _Health(NamedTuple):
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None
    rows_correctable: int | None = None
    rows_uncorrectable: int | None = None
    rows_pending: bool | None = None
    rows_failure: bool | None = None


def _start_nvml(nvml: Any) -> None:
    """``nvmlInit``, with a start-up error that says what is wrong and what to do instead."""
    try:
        nvml.nvmlInit()
    except pynvml.NVMLError as exc:
        problem = _INIT_PROBLEMS.get(_code(exc), f"NVML could not start: {exc}.")
        raise SourceError(f"{problem} {_NO_NVML_HINT}") from exc
