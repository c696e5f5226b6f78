"""NVML GPM (GPU Performance Monitoring, Hopper and newer): averages of PCIe, NVLink and SM, tensor and DRAM activity
over the interval between two collections.

Each GPU keeps the GPM sample of its previous read; a read takes a new sample (``nvmlGpmSampleGet``) and asks
``nvmlGpmMetricsGet`` for the metrics between the two, so the values are true averages over the collection interval,
with no extra waiting. The first read after start, and the read after a failed sample, have no GPM values. GPM is used
where ``nvmlGpmQueryDeviceSupport`` says so; elsewhere (GPUs before Hopper, drivers without the ``nvmlGpm*`` symbols,
MIG-enabled GPUs) PCIe throughput comes from NVML's 20 ms sample and NVLink throughput from the cumulative field
counters. A GPM call that answers NotSupported hands all of the GPU's quantities back to those calls, a metric that
does only its own quantity, within the same read (``read_gpm`` runs before the older calls are chosen).
The quantities and where each GPU's values come from are ``PCIE``, ``NVLINK``, ``PROFILING`` and ``SOURCE_*``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import pynvml  # noqa: TID251 (the NVML modules are the pynvml choke point)

from gpulens.exporter.nvmlcalls import FUNCTION_NOT_FOUND, NOT_SUPPORTED, SUCCESS, Calls, optional_constant
from gpulens.exporter.nvmlgpu import GpmMetric, GpmState, Gpu

PCIE: Final = "pcie"
NVLINK: Final = "nvlink"
PROFILING: Final = "profiling"  # SM, tensor and DRAM activity
SOURCE_GPM: Final = "gpm"
SOURCE_SAMPLE: Final = "sample"  # nvmlDeviceGetPcieThroughput: one 20 ms sample
SOURCE_COUNTERS: Final = "counters"  # the NVLink throughput field values: cumulative KiB counters

MIB: Final = 1024 * 1024  # GPM's throughput metrics are in MiB/s
PERCENT: Final = 0.01  # GPM's utilization metrics are in percent

# GPM appeared in nvidia-ml-py 11.525; every name below is in the 12.535 floor, but is read defensively all the same.
_METRICS_GET: Final[Any] = getattr(pynvml, "c_nvmlGpmMetricsGet_t", None)
_METRICS_GET_VERSION: Final = optional_constant("NVML_GPM_METRICS_GET_VERSION")
_ONE_VALUE: Final = {
    "pcie_tx": (PCIE, "NVML_GPM_METRIC_PCIE_TX_PER_SEC", MIB),
    "pcie_rx": (PCIE, "NVML_GPM_METRIC_PCIE_RX_PER_SEC", MIB),
    "sm_active": (PROFILING, "NVML_GPM_METRIC_SM_UTIL", PERCENT),
    "tensor_active": (PROFILING, "NVML_GPM_METRIC_ANY_TENSOR_UTIL", PERCENT),
    "dram_active": (PROFILING, "NVML_GPM_METRIC_DRAM_BW_UTIL", PERCENT),
    "nvlink_tx": (NVLINK, "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", MIB),
    "nvlink_rx": (NVLINK, "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", MIB),
}


def _link_metric(link: int, direction: str) -> str:
    return f"NVML_GPM_METRIC_NVLINK_L{link}_{direction}_PER_SEC"


@dataclass(frozen=True, slots=True)
class GpmValues:
    """What one GPM read found, in gpulens units; empty (all None) when GPM had no interval to average over."""

    values: Mapping[str, float | None] = field(default_factory=dict)

    def get(self, key: str) -> float | None:
        return self.values.get(key)

    def links(self, direction: str, count: int) -> tuple[float | None, ...]:
        return tuple(self.values.get(f"link_{direction}:{link}") for link in range(count))


def _metrics_for(gpu: Gpu, capacity: int) -> tuple[GpmMetric, ...] | None:
    """The metrics to ask a GPU for, or None when this nvidia-ml-py lacks one of the basic ones."""
    metrics = []
    for key, (quantity, name, scale) in _ONE_VALUE.items():
        if quantity == NVLINK and not gpu.links:
            continue
        metric_id = optional_constant(name)
        if metric_id is None:
            return None
        metrics.append(GpmMetric(key, quantity, name, metric_id, scale))
    for link in range(gpu.links):
        for direction in ("TX", "RX"):
            name = _link_metric(link, direction)
            metric_id = optional_constant(name)
            if metric_id is None:  # a library that knows fewer links than this GPU has: no NVLink from GPM
                return tuple(m for m in metrics if m.quantity != NVLINK)
            metrics.append(GpmMetric(f"link_{direction.lower()}:{link}", NVLINK, name, metric_id, MIB))
    return tuple(metrics) if len(metrics) <= capacity else tuple(m for m in metrics if m.quantity != NVLINK)


def open_gpm(calls: Calls, gpu: Gpu) -> GpmState | None:
    """The GPU's GPM state where NVML offers GPM on it, else None (the older calls serve it). Allocates two samples."""
    if _METRICS_GET is None or _METRICS_GET_VERSION is None or gpu.mig_enabled:
        return None  # a MIG-enabled GPU would need a sample per GPU instance (nvmlGpmMigSampleGet): not read
    support = calls.call(gpu, "nvmlGpmQueryDeviceSupport", gpu.handle, quiet=frozenset({NOT_SUPPORTED}))
    if support is None or not int(support.isSupportedDevice):
        return None
    request = _METRICS_GET()
    metrics = _metrics_for(gpu, len(request.metrics))
    if not metrics:
        return None
    samples = [calls.call(gpu, "nvmlGpmSampleAlloc") for _ in range(2)]
    if samples[0] is None or samples[1] is None:
        for sample in samples:
            if sample is not None:
                calls.call(gpu, "nvmlGpmSampleFree", sample)
        return None
    request.version = _METRICS_GET_VERSION
    state = GpmState((samples[0], samples[1]), metrics, request, {m.quantity for m in metrics})
    _ask(state)
    return state


def _ask(state: GpmState) -> None:
    """Set the request to the metrics of the quantities GPM still serves."""
    state.metrics = tuple(m for m in state.metrics if m.quantity in state.quantities)
    state.request.numMetrics = len(state.metrics)
    for slot, metric in zip(state.request.metrics, state.metrics, strict=False):
        slot.metricId = metric.metric_id


def close_gpm(calls: Calls, gpu: Gpu) -> None:
    """Free the GPU's GPM samples; the older calls serve it from now on."""
    state = gpu.gpm
    gpu.gpm = None
    if state is not None:
        for sample in state.samples:
            calls.call(gpu, "nvmlGpmSampleFree", sample)


def sources(gpu: Gpu) -> dict[str, str]:
    """Quantity -> where this GPU's values come from now (profiling has no source without GPM)."""
    state = gpu.gpm
    found = {PCIE: SOURCE_GPM if state is not None and state.serves(PCIE) else SOURCE_SAMPLE}
    if gpu.links:
        found[NVLINK] = SOURCE_GPM if state is not None and state.serves(NVLINK) else SOURCE_COUNTERS
    if state is not None and state.serves(PROFILING):
        found[PROFILING] = SOURCE_GPM
    return found


def read_gpm(calls: Calls, gpu: Gpu) -> GpmValues:
    """Take this read's sample and average over the interval since the previous one. Ends GPM on the GPU where the
    driver refuses it (NotSupported, FunctionNotFound); any other failure costs one interval.
    """
    state = gpu.gpm
    if state is None:
        return GpmValues()
    previous = state.previous
    current = 1 if previous == 0 else 0
    state.previous = None  # until this sample is taken, a lost GPU included
    _, code = calls.attempt(gpu, "nvmlGpmSampleGet", gpu.handle, state.samples[current])
    if code is not None:
        return _failed(calls, gpu, code)
    state.previous = current
    if previous is None:
        return GpmValues()
    state.request.sample1 = state.samples[previous]
    state.request.sample2 = state.samples[current]
    _, code = calls.attempt(gpu, "nvmlGpmMetricsGet", state.request)
    if code is not None:
        return _failed(calls, gpu, code)
    return GpmValues(_values(calls, gpu, state))


def forget(gpu: Gpu) -> None:
    """Start the GPU's GPM interval again (it was lost): its next read has no GPM values."""
    if gpu.gpm is not None:
        gpu.gpm.previous = None


def _failed(calls: Calls, gpu: Gpu, code: int) -> GpmValues:
    if code in (NOT_SUPPORTED, FUNCTION_NOT_FOUND):
        close_gpm(calls, gpu)
    return GpmValues()


def _values(calls: Calls, gpu: Gpu, state: GpmState) -> dict[str, float | None]:
    values: dict[str, float | None] = {}
    refused = False
    for slot, metric in zip(state.request.metrics, state.metrics, strict=False):
        code = int(slot.nvmlReturn)
        if code == SUCCESS:
            values[metric.key] = float(slot.value) * metric.scale
            continue
        values[metric.key] = None
        calls.failed(gpu, f"nvmlGpmMetricsGet({metric.name})", code)
        if code == NOT_SUPPORTED:
            state.quantities.discard(metric.quantity)
            refused = True
    if not state.quantities:
        close_gpm(calls, gpu)
    elif refused:
        _ask(state)
    return values
