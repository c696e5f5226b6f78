"""The GPM part of the fake pynvml (``nvmlGpm*``), mixed into ``tests.fakes.fake_nvml.FakeNvml``.

It answers with pynvml's own ctypes structures: ``c_nvmlGpmSupport_t`` from ``nvmlGpmQueryDeviceSupport``, opaque
``c_nvmlGpmSample_t`` pointers from ``nvmlGpmSampleAlloc``, and it fills the caller's ``c_nvmlGpmMetricsGet_t``. A
sample records a GPU's cumulative activity (the integrals over the fake's clock of its PCIe rates, its SM, tensor and
DRAM utilization and its NVLink counters); ``nvmlGpmMetricsGet`` divides the growth between two samples by the time
between them, as GPM does, so a test that changes a rate midway sees the average. Whether a GPU supports GPM, and
which metrics answer NotSupported, are set per GPU (``FakeGpu.gpm_supported``, ``FakeGpu.gpm_unsupported_metrics``).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pynvml

if TYPE_CHECKING:
    from tests.fakes.fake_nvml import FakeGpu

_PCIE = {pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: "pcie_tx_kib", pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: "pcie_rx_kib"}
_UTIL = {
    pynvml.NVML_GPM_METRIC_SM_UTIL: "sm_util",
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: "tensor_util",
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: "dram_util",
}
_NVLINK_TOTAL = {
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: "tx",
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: "rx",
}
_FIRST_LINK = pynvml.NVML_GPM_METRIC_NVLINK_L0_RX_PER_SEC  # per link: RX, then TX


@dataclass
class GpmSample:
    """What a filled sample holds: the GPU, the time, and its cumulative activity then."""

    gpu: int
    time: float
    totals: dict[str, float]
    nvlink_tx_kib: list[float]
    nvlink_rx_kib: list[float]


@dataclass
class _Buffer:
    """An allocated sample: the opaque struct it points at, kept alive, and what was last sampled into it."""

    target: Any
    pointer: Any
    sample: GpmSample | None = None


@dataclass
class GpmCounts:
    """The samples allocated and not yet freed, and how many were allocated and freed."""

    allocated: int = 0
    freed: int = 0
    live: dict[int, _Buffer] = field(default_factory=dict)


def _address(pointer: Any) -> int | None:
    return ctypes.cast(pointer, ctypes.c_void_p).value


class FakeGpmMixin:
    """``nvmlGpmQueryDeviceSupport``, ``nvmlGpmSampleAlloc/Get/Free`` and ``nvmlGpmMetricsGet``."""

    # Provided by FakeNvml.
    gpus: list[FakeGpu]
    clock: Any
    gpm: GpmCounts
    _lock: threading.Lock
    _gpu_handles: list[Any]
    _call: Callable[..., Any]
    _index_of: Callable[[Any], int]
    _advance: Callable[[int], Any]

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        def produce() -> Any:
            support = pynvml.c_nvmlGpmSupport_t()
            support.version = pynvml.NVML_GPM_SUPPORT_VERSION
            support.isSupportedDevice = int(self.gpus[self._index_of(handle)].gpm_supported)
            return support

        return self._call("nvmlGpmQueryDeviceSupport", produce, handle=handle)

    def nvmlGpmSampleAlloc(self) -> Any:
        def produce() -> Any:
            target = pynvml.struct_c_nvmlGpmSample_t()
            pointer = pynvml.c_nvmlGpmSample_t(target)
            with self._lock:
                self.gpm.live[_address(pointer) or 0] = _Buffer(target, pointer)
                self.gpm.allocated += 1
            return pointer

        return self._call("nvmlGpmSampleAlloc", produce)

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        def produce() -> None:
            with self._lock:
                if self.gpm.live.pop(_address(sample) or 0, None) is None:
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
                self.gpm.freed += 1

        self._call("nvmlGpmSampleFree", produce)

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any:
        def produce() -> Any:
            buffer = self.gpm.live.get(_address(sample) or 0)
            if buffer is None:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            index = self._index_of(handle)
            gpu = self.gpus[index]
            if not gpu.gpm_supported:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            self._advance(index)
            with self._lock:
                tx, rx = list(gpu.nvlink_tx_kib), list(gpu.nvlink_rx_kib)
                buffer.sample = GpmSample(index, self.clock.monotonic(), dict(gpu.gpm_totals), tx, rx)
            return sample

        return self._call("nvmlGpmSampleGet", produce, handle=handle)

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        first = self.gpm.live.get(_address(request.sample1) or 0)
        second = self.gpm.live.get(_address(request.sample2) or 0)
        owner = None if second is None or second.sample is None else second.sample.gpu
        handle = None if owner is None else self._gpu_handles[owner].pointer  # per-GPU failures apply

        def produce() -> Any:
            if request.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
            if first is None or second is None or first.sample is None or second.sample is None:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            before, after = first.sample, second.sample
            elapsed = after.time - before.time
            if before.gpu != after.gpu or elapsed <= 0 or not 0 < request.numMetrics <= len(request.metrics):
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            gpu = self.gpus[after.gpu]
            for slot in request.metrics[: request.numMetrics]:
                value = _metric(gpu, int(slot.metricId), before, after, elapsed)
                if value is None:
                    slot.nvmlReturn, slot.value = pynvml.NVML_ERROR_NOT_SUPPORTED, 0.0
                else:
                    slot.nvmlReturn, slot.value = pynvml.NVML_SUCCESS, value
            return request

        return self._call("nvmlGpmMetricsGet", produce, handle=handle)


def _metric(gpu: FakeGpu, metric: int, before: GpmSample, after: GpmSample, elapsed: float) -> float | None:
    """A metric over the interval between two samples, in GPM's units (MiB/s, percent), or None (NotSupported)."""
    if metric in gpu.gpm_unsupported_metrics:
        return None

    def growth(key: str) -> float:
        return (after.totals.get(key, 0.0) - before.totals.get(key, 0.0)) / elapsed

    if metric in _PCIE:
        return growth(_PCIE[metric]) / 1024  # KiB/s -> MiB/s
    if metric in _UTIL:
        return growth(_UTIL[metric])
    links = len(after.nvlink_tx_kib)
    direction = _NVLINK_TOTAL.get(metric)
    offset = metric - _FIRST_LINK
    if direction is None and 0 <= offset < 2 * links:
        direction = "tx" if offset % 2 else "rx"
    if direction is None or not links:
        return None
    now, then = (after.nvlink_tx_kib, before.nvlink_tx_kib)
    if direction == "rx":
        now, then = after.nvlink_rx_kib, before.nvlink_rx_kib
    chosen = range(links) if metric in _NVLINK_TOTAL else [offset // 2]
    return sum(now[link] - then[link] for link in chosen) / elapsed / 1024  # KiB -> MiB
