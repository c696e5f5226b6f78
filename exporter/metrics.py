"""Render a NodeSnapshot as Prometheus text: the gpulens families of the catalogue, plus dcgm-exporter names on demand.

Rendering happens once per collection (the result is cached by the caller), never per scrape, and never touches
hardware: it only reads the snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

import gpulens
from gpulens.catalogue import GPU_FIELDS, GPU_LABELS
from gpulens.model import THROTTLE_REASONS, GpuReading, NodeSnapshot

MIB: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ExporterHealth:
    """The exporter's own state, exported next to the GPU series."""

    collect_duration_seconds: float | None = None
    last_collect_timestamp_seconds: float | None = None
    collect_errors: Mapping[str, int] = field(default_factory=dict)


def _gpu_labels(g: GpuReading) -> list[str]:
    return [g.node, str(g.gpu), g.uuid, g.model]


def _number(value: float | int | bool) -> float:
    return float(value)


def _gpulens_families(snapshot: NodeSnapshot) -> Iterator[Metric]:
    gpus = snapshot.gpus
    info = GaugeMetricFamily(
        "gpulens_gpu_info",
        "Static GPU identity; always 1.",
        labels=[*GPU_LABELS, "pci_bus_id", "driver_version"],
    )
    up = GaugeMetricFamily("gpulens_gpu_up", "1 while the GPU answers, 0 once it is lost.", labels=list(GPU_LABELS))
    for g in gpus:
        info.add_metric([*_gpu_labels(g), g.pci_bus_id or "", g.driver_version or snapshot.driver_version or ""], 1)
        up.add_metric(_gpu_labels(g), 1 if g.up else 0)
    yield info
    yield up

    families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
    for spec in GPU_FIELDS:
        family = families.get(spec.family)
        if family is None:
            label_names = [*GPU_LABELS, *(k for k, _ in spec.labels)]
            if spec.type == "counter":
                family = CounterMetricFamily(spec.family, spec.help, labels=label_names)
            else:
                family = GaugeMetricFamily(spec.family, spec.help, labels=label_names)
            families[spec.family] = family
        extra = [v for _, v in spec.labels]
        for g in gpus:
            value = getattr(g, spec.field)
            if value is not None:
                family.add_metric([*_gpu_labels(g), *extra], _number(value))
    yield from families.values()

    throttle = GaugeMetricFamily(
        "gpulens_gpu_throttle_active",
        "1 while a clock-event (throttle) reason is active.",
        labels=[*GPU_LABELS, "reason"],
    )
    xids = CounterMetricFamily(
        "gpulens_gpu_xid_errors", "XID error events by code since the exporter started.", labels=[*GPU_LABELS, "xid"]
    )
    for g in gpus:
        if g.throttle_reasons is not None:
            for name, bit in THROTTLE_REASONS:
                throttle.add_metric([*_gpu_labels(g), name], 1 if g.throttle_reasons & bit else 0)
        for code, count in sorted(g.xid_errors.items()):
            xids.add_metric([*_gpu_labels(g), str(code)], count)
    yield throttle
    yield xids

    link_tp = GaugeMetricFamily(
        "gpulens_gpu_nvlink_link_throughput_bytes_per_second",
        "NVLink throughput per link (bytes per second).",
        labels=[*GPU_LABELS, "link", "direction"],
    )
    link_up = GaugeMetricFamily(
        "gpulens_gpu_nvlink_link_active", "1 while an NVLink link is active.", labels=[*GPU_LABELS, "link"]
    )
    by_uuid = {g.uuid: g for g in gpus}
    for link in snapshot.links:
        owner = by_uuid.get(link.uuid)
        if owner is None:
            continue
        base = [*_gpu_labels(owner), str(link.link)]
        link_up.add_metric(base, 1 if link.active else 0)
        if link.tx_bytes_per_second is not None:
            link_tp.add_metric([*base, "tx"], link.tx_bytes_per_second)
        if link.rx_bytes_per_second is not None:
            link_tp.add_metric([*base, "rx"], link.rx_bytes_per_second)
    yield link_up
    yield link_tp

    mig_used = GaugeMetricFamily(
        "gpulens_gpu_mig_memory_used_bytes",
        "Memory in use per MIG device (bytes).",
        labels=[*GPU_LABELS, "mig_uuid", "gpu_instance_id", "profile"],
    )
    mig_total = GaugeMetricFamily(
        "gpulens_gpu_mig_memory_total_bytes",
        "Total memory per MIG device (bytes).",
        labels=[*GPU_LABELS, "mig_uuid", "gpu_instance_id", "profile"],
    )
    for mig in snapshot.migs:
        owner = by_uuid.get(mig.uuid)
        if owner is None:
            continue
        labels = [*_gpu_labels(owner), mig.mig_uuid, str(mig.gpu_instance_id), mig.profile or ""]
        if mig.memory_used_bytes is not None:
            mig_used.add_metric(labels, mig.memory_used_bytes)
        if mig.memory_total_bytes is not None:
            mig_total.add_metric(labels, mig.memory_total_bytes)
    yield mig_used
    yield mig_total

    job_info = GaugeMetricFamily(
        "gpulens_gpu_job_info",
        "1 for each job holding a GPU.",
        labels=["node", "gpu", "uuid", "job_id", "user"],
    )
    for job in snapshot.jobs:
        job_info.add_metric([job.node, str(job.gpu), job.uuid, job.job_id, job.user or ""], 1)
    yield job_info

    processes = GaugeMetricFamily(
        "gpulens_process_gpu_memory_bytes",
        "GPU memory used by a compute process (bytes).",
        labels=["node", "gpu", "uuid", "pid", "job_id", "user", "command"],
    )
    for p in snapshot.processes:
        if p.used_memory_bytes is not None:
            processes.add_metric(
                [p.node, str(p.gpu), p.uuid, str(p.pid), p.job_id or "", p.user or "", p.command or ""],
                p.used_memory_bytes,
            )
    yield processes


def _exporter_families(health: ExporterHealth) -> Iterator[Metric]:
    build = GaugeMetricFamily("gpulens_exporter_build_info", "The gpulens version; always 1.", labels=["version"])
    build.add_metric([gpulens.__version__], 1)
    yield build
    duration = GaugeMetricFamily(
        "gpulens_exporter_collect_duration_seconds", "Duration of the last collection (seconds)."
    )
    if health.collect_duration_seconds is not None:
        duration.add_metric([], health.collect_duration_seconds)
    yield duration
    errors = CounterMetricFamily(
        "gpulens_exporter_collect_errors", "Collection failures by reason since start.", labels=["reason"]
    )
    for reason, count in sorted(health.collect_errors.items()):
        errors.add_metric([reason], count)
    yield errors
    last = GaugeMetricFamily(
        "gpulens_exporter_last_collect_timestamp_seconds", "Time of the last successful collection (Unix seconds)."
    )
    if health.last_collect_timestamp_seconds is not None:
        last.add_metric([], health.last_collect_timestamp_seconds)
    yield last


# --- dcgm-exporter compatible families (--dcgm-compat) -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _DcgmField:
    name: str
    help: str
    value: Callable[[GpuReading], float | None]


def _scaled(attr: str, factor: float) -> Callable[[GpuReading], float | None]:
    def get(g: GpuReading) -> float | None:
        value = getattr(g, attr)
        return None if value is None else float(value) * factor

    return get


def _fb_free(g: GpuReading) -> float | None:
    if g.memory_total_bytes is None or g.memory_used_bytes is None:
        return None
    free = g.memory_total_bytes - g.memory_used_bytes - (g.memory_reserved_bytes or 0)
    return max(free, 0) / MIB


def _nvlink_total(g: GpuReading) -> float | None:
    if g.nvlink_tx_bytes_per_second is None or g.nvlink_rx_bytes_per_second is None:
        return None
    return (g.nvlink_tx_bytes_per_second + g.nvlink_rx_bytes_per_second) / 1e6


# In dcgm-exporter's legacy names and units (the ones its published Grafana dashboards use).
DCGM_FIELDS: Final[tuple[_DcgmField, ...]] = (
    _DcgmField("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", _scaled("utilization_ratio", 100)),
    _DcgmField("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", _scaled("memory_used_bytes", 1 / MIB)),
    _DcgmField("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", _fb_free),
    _DcgmField("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", _scaled("temperature_celsius", 1)),
    _DcgmField("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", _scaled("memory_temperature_celsius", 1)),
    _DcgmField("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", _scaled("power_watts", 1)),
    _DcgmField(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "Total energy consumption since boot (in mJ).",
        _scaled("energy_joules_total", 1000),
    ),
    _DcgmField("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", _scaled("sm_clock_hertz", 1e-6)),
    _DcgmField("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", _scaled("memory_clock_hertz", 1e-6)),
    _DcgmField("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.", _scaled("pcie_replays_total", 1)),
    _DcgmField(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "Total number of single-bit volatile ECC errors.",
        _scaled("ecc_corrected_errors_total", 1),
    ),
    _DcgmField(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Total number of double-bit volatile ECC errors.",
        _scaled("ecc_uncorrected_errors_total", 1),
    ),
    _DcgmField(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "Total number of NVLink bandwidth counters for all lanes (in MB/s).",
        _nvlink_total,
    ),
    _DcgmField(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "The rate of data transmitted over the PCIe bus (in B/s).",
        _scaled("pcie_tx_bytes_per_second", 1),
    ),
    _DcgmField(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "The rate of data received over the PCIe bus (in B/s).",
        _scaled("pcie_rx_bytes_per_second", 1),
    ),
    _DcgmField(
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "The rate of data transmitted over NVLink (in B/s).",
        _scaled("nvlink_tx_bytes_per_second", 1),
    ),
    _DcgmField(
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "The rate of data received over NVLink (in B/s).",
        _scaled("nvlink_rx_bytes_per_second", 1),
    ),
    _DcgmField(
        "DCGM_FI_PROF_SM_ACTIVE",
        "The ratio of cycles an SM has at least 1 warp assigned.",
        _scaled("sm_active_ratio", 1),
    ),
    _DcgmField(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        _scaled("tensor_active_ratio", 1),
    ),
    _DcgmField(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "Ratio of cycles the device memory interface is active.",
        _scaled("dram_active_ratio", 1),
    ),
)
DCGM_LABELS: Final = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")


def _dcgm_families(snapshot: NodeSnapshot, last_xid: Mapping[str, int]) -> Iterator[Metric]:
    up_gpus = [g for g in snapshot.gpus if g.up]

    def labels(g: GpuReading) -> list[str]:
        return [str(g.gpu), g.uuid, g.pci_bus_id or "", f"nvidia{g.gpu}", g.model, g.node]

    for spec in DCGM_FIELDS:
        # dcgm-exporter's names are kept byte for byte; its cumulative fields lack the _total suffix that a
        # Prometheus counter needs, so every family is declared a gauge (PromQL's rate() works on either).
        family = GaugeMetricFamily(spec.name, spec.help, labels=list(DCGM_LABELS))
        for g in up_gpus:
            value = spec.value(g)
            if value is not None:
                family.add_metric(labels(g), value)
        yield family
    xid = GaugeMetricFamily(
        "DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", labels=list(DCGM_LABELS)
    )
    for g in up_gpus:
        xid.add_metric(labels(g), last_xid.get(g.uuid, 0))
    yield xid


class LastXidTracker:
    """Turns per-code XID counters into dcgm-exporter's sticky "last XID seen" value, across snapshots."""

    def __init__(self) -> None:
        self._counts: dict[str, dict[int, int]] = {}
        self._last: dict[str, int] = {}

    def update(self, snapshot: NodeSnapshot) -> Mapping[str, int]:
        for g in snapshot.gpus:
            previous = self._counts.get(g.uuid, {})
            grown = [code for code, count in g.xid_errors.items() if count > previous.get(code, 0)]
            if grown:
                self._last[g.uuid] = max(grown)
            self._counts[g.uuid] = dict(g.xid_errors)
        return dict(self._last)


class SnapshotCollector(Collector):
    """A prometheus_client collector over one snapshot; registering it reads nothing."""

    def __init__(
        self,
        snapshot: NodeSnapshot | None,
        health: ExporterHealth,
        *,
        dcgm_compat: bool = False,
        last_xid: Mapping[str, int] | None = None,
    ) -> None:
        self._snapshot = snapshot
        self._health = health
        self._dcgm_compat = dcgm_compat
        self._last_xid = last_xid or {}

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        if self._snapshot is not None:
            yield from _gpulens_families(self._snapshot)
            if self._dcgm_compat:
                yield from _dcgm_families(self._snapshot, self._last_xid)
        yield from _exporter_families(self._health)


def render_metrics(
    snapshot: NodeSnapshot | None,
    health: ExporterHealth,
    *,
    dcgm_compat: bool = False,
    last_xid: Mapping[str, int] | None = None,
) -> bytes:
    """The Prometheus text exposition of a snapshot (``None``: only the exporter's own families)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot, health, dcgm_compat=dcgm_compat, last_xid=last_xid))
    return generate_latest(registry)
