"""Render a NodeSnapshot as Prometheus text: the gpulens families of the catalogue, plus dcgm-exporter names on demand.

Rendering happens at most once per collection, on the first scrape after it (the result is cached by the caller,
``gpulens.exporter.poller.Published``), and never touches hardware: it only reads the snapshot. The text is written here
rather than through prometheus_client's registry: its generic writer re-validates and re-escapes every label of
every sample, which made rendering an 8-GPU node cost ~6 ms of CPU per collection, a third of the exporter's whole
budget at a 1 s interval. Here each GPU's label set is escaped once. The output is checked by prometheus_client's
parser and by promtool in the tests.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final

import gpulens
from gpulens.dcgmfields import COMPAT_FIELDS, COMPAT_LABELS, MIG_MEMORY_TARGETS, compat_value, mig_memory_value
from gpulens.exporter.fabricmetrics import fabric_families
from gpulens.exporter.hardwaremetrics import hardware_families
from gpulens.exporter.inspectormetrics import inspector_families
from gpulens.exporter.kernelmetrics import kernel_families
from gpulens.exporter.ncclmetrics import nccl_families
from gpulens.exporter.promfamily import Family, escape_label, render_labels
from gpulens.exporter.sidereader import ReaderState
from gpulens.metriccatalogue import GPU_FIELDS, GPU_LABELS
from gpulens.model import (
    THROTTLE_REASONS,
    THROTTLE_REPORTED,
    THROTTLE_SOURCES,
    GpuJob,
    GpuReading,
    MigReading,
    NodeSnapshot,
)
from gpulens.nodehealth import STATES, node_health


@dataclass(frozen=True, slots=True)
class ExporterHealth:
    """The exporter's own state, exported next to the GPU series."""

    collect_duration_seconds: float | None = None
    last_collect_timestamp_seconds: float | None = None
    collect_errors: Mapping[str, int] = field(default_factory=dict)
    # Each reader ("gpus", "pods", "fabric", ...): seconds since its last success and whether that is too long ago.
    readers: Mapping[str, ReaderState] = field(default_factory=dict)


PROCESS_LABELS: Final = ("node", "gpu", "uuid", "job_id", "user")  # the process family's labels without pids


def _gpu_labels(g: GpuReading) -> list[str]:
    return [g.node, str(g.gpu), g.uuid, g.model]


def _gpulens_families(snapshot: NodeSnapshot, *, process_pids: bool) -> Iterator[Family]:
    gpus = snapshot.gpus
    # Each GPU's identity labels are escaped once and reused by every series of that GPU.
    prefixes = [render_labels(GPU_LABELS, _gpu_labels(g)) for g in gpus]
    info = Family(
        "gpulens_gpu_info",
        "Static GPU identity; always 1.",
        labels=[*GPU_LABELS, "pci_bus_id", "driver_version"],
    )
    up = Family("gpulens_gpu_up", "1 while the GPU answers, 0 once it is lost.", labels=list(GPU_LABELS))
    for g, prefix in zip(gpus, prefixes, strict=True):
        driver = g.driver_version or snapshot.driver_version or ""
        info.add_rendered(
            prefix + "," + render_labels(("pci_bus_id", "driver_version"), (g.pci_bus_id or "", driver)), 1
        )
        up.add_rendered(prefix, g.up)
    yield info
    yield up

    sources = Family(
        "gpulens_gpu_metric_source_info",
        "Where a GPU's values of a quantity (pcie, nvlink, profiling) come from: gpm (NVML GPM averages over the "
        "collection interval), sample (NVML's 20 ms PCIe sample) or counters (NVML's NVLink counters); always 1.",
        labels=[*GPU_LABELS, "quantity", "source"],
    )
    for g, prefix in zip(gpus, prefixes, strict=True):
        for quantity, source in sorted(snapshot.metric_sources.get(g.uuid, {}).items()):
            sources.add_rendered(f'{prefix},quantity="{escape_label(quantity)}",source="{escape_label(source)}"', 1)
    yield sources

    families: dict[str, Family] = {}
    for spec in GPU_FIELDS:
        family = families.get(spec.family)
        if family is None:
            label_names = [*GPU_LABELS, *(k for k, _ in spec.labels)]
            family = Family(spec.family, spec.help, labels=label_names, type=spec.type)
            families[spec.family] = family
        extra = "".join(f',{k}="{escape_label(v)}"' for k, v in spec.labels)
        for g, prefix in zip(gpus, prefixes, strict=True):
            value = getattr(g, spec.field)
            if value is not None:
                family.add_rendered(prefix + extra, value)
    yield from families.values()

    throttle = Family(
        "gpulens_gpu_throttle_active",
        "1 while a clock-event (throttle) reason is active; source: reported, violation (a DCGM violation counter "
        "rose) or inferred (from clock, temperature and power).",
        labels=[*GPU_LABELS, "reason", "source"],
    )
    xids = Family(
        "gpulens_gpu_xid_errors_total",
        "XID error events by code since the exporter started (NVML's or dcgm-exporter's and the kernel log's, "
        "each event once).",
        labels=[*GPU_LABELS, "xid"],
        type="counter",
    )
    for g, prefix in zip(gpus, prefixes, strict=True):
        if g.throttle_reasons is not None:
            source = g.throttle_reasons_source if g.throttle_reasons_source in THROTTLE_SOURCES else THROTTLE_REPORTED
            for name, bit in THROTTLE_REASONS:
                throttle.add_rendered(
                    f'{prefix},reason="{name}",source="{source}"', 1 if g.throttle_reasons & bit else 0
                )
        for code, count in sorted(g.xid_errors.items()):
            xids.add_rendered(f'{prefix},xid="{code}"', count)
    yield throttle
    yield xids

    # Per-link state shows which link is down; per-link throughput stays in the JSON snapshot (it would triple the
    # series count of an NVLink node for little use in Prometheus).
    link_up = Family(
        "gpulens_gpu_nvlink_link_active", "1 while an NVLink link is active.", labels=[*GPU_LABELS, "link"]
    )
    by_uuid = {g.uuid: prefix for g, prefix in zip(gpus, prefixes, strict=True)}
    for link in snapshot.links:
        owner = by_uuid.get(link.uuid)
        if owner is not None:
            link_up.add_rendered(f'{owner},link="{link.link}"', link.active)
    yield link_up

    mig_used = Family(
        "gpulens_gpu_mig_memory_used_bytes",
        "Memory in use per MIG device (bytes).",
        labels=[*GPU_LABELS, "mig_uuid", "gpu_instance_id", "profile"],
    )
    mig_total = Family(
        "gpulens_gpu_mig_memory_total_bytes",
        "Total memory per MIG device (bytes).",
        labels=[*GPU_LABELS, "mig_uuid", "gpu_instance_id", "profile"],
    )
    for mig in snapshot.migs:
        owner = by_uuid.get(mig.uuid)
        if owner is None:
            continue
        mig_labels = ("mig_uuid", "gpu_instance_id", "profile")
        rendered = owner + "," + render_labels(mig_labels, (mig.mig_uuid, str(mig.gpu_instance_id), mig.profile or ""))
        if mig.memory_used_bytes is not None:
            mig_used.add_rendered(rendered, mig.memory_used_bytes)
        if mig.memory_total_bytes is not None:
            mig_total.add_rendered(rendered, mig.memory_total_bytes)
    yield mig_used
    yield mig_total

    job_info = Family(
        "gpulens_gpu_job_info",
        "1 for each job holding a GPU.",
        labels=["node", "gpu", "uuid", "job_id", "user"],
    )
    for job in snapshot.jobs:
        job_info.add_metric([job.node, str(job.gpu), job.uuid, job.job_id, job.user or ""], 1)
    yield job_info

    scheduler_info = Family(
        "gpulens_job_info",
        "1 for each job holding one of the node's GPUs, with what the scheduler (Slurm) says of it.",
        labels=["job_id", "name", "user", "account", "partition"],
    )
    for meta in snapshot.job_info:
        labels = [meta.job_id, meta.name or "", meta.user or "", meta.account or "", meta.partition or ""]
        scheduler_info.add_metric(labels, 1)
    yield scheduler_info
    pod_info = Family(
        "gpulens_pod_gpu_info",
        "1 for each Kubernetes pod container holding a GPU (the kubelet's pod-resources API); job_id is namespace/pod.",
        labels=["node", "gpu", "uuid", "job_id", "namespace", "pod", "container", "pod_uid", "mig_uuid"],
    )
    for job in snapshot.jobs:
        if job.pod is not None:
            values = [job.namespace or "", job.pod, job.container or "", job.pod_uid or "", job.mig_uuid or ""]
            pod_info.add_metric([job.node, str(job.gpu), job.uuid, job.job_id, *values], 1)
    yield pod_info

    yield _process_family(snapshot, pids=process_pids)
    yield from _health_families(snapshot)


def _health_families(snapshot: NodeSnapshot) -> Iterator[Family]:
    """The node's health (``gpulens.nodehealth``): 1 for its state, 0 for the others; and its suggested action."""
    health = node_health(snapshot)
    state = Family(
        "gpulens_node_health",
        "The node's health as its GPUs, links and ports tell it: 1 for its state (Healthy, Degraded, Unhealthy).",
        labels=["node", "state"],
    )
    for name in STATES:
        state.add_metric([snapshot.node, name], 1 if name == health.state else 0)
    yield state
    action = Family(
        "gpulens_node_health_action",
        "1 for the action that would make the node healthy (none, check-application, reset-gpu, reboot, "
        "hardware-inspection).",
        labels=["node", "action"],
    )
    action.add_metric([snapshot.node, health.action], 1)
    yield action


def _process_family(snapshot: NodeSnapshot, *, pids: bool) -> Family:
    """GPU memory of the compute processes: summed per GPU and job by default (no ``pid`` label: series that do not
    come and go with every process, as dcgm-exporter's), one series per process with ``pids``."""
    if pids:
        family = Family(
            "gpulens_process_gpu_memory_bytes",
            "GPU memory used by a compute process (bytes).",
            labels=[*PROCESS_LABELS[:3], "pid", *PROCESS_LABELS[3:], "command"],
        )
        for p in snapshot.processes:
            if p.memory_used_bytes is not None:
                family.add_metric(
                    [p.node, str(p.gpu), p.uuid, str(p.pid), p.job_id or "", p.user or "", p.command or ""],
                    p.memory_used_bytes,
                )
        return family
    family = Family(
        "gpulens_process_gpu_memory_bytes",
        "GPU memory used by a job's compute processes on a GPU (bytes; per process with --process-pids).",
        labels=list(PROCESS_LABELS),
    )
    sums: dict[tuple[str, str, str, str, str], int] = {}
    for p in snapshot.processes:
        if p.memory_used_bytes is not None:
            key = (p.node, str(p.gpu), p.uuid, p.job_id or "", p.user or "")
            sums[key] = sums.get(key, 0) + p.memory_used_bytes
    for key, total in sums.items():
        family.add_metric(list(key), total)
    return family


def _exporter_families(health: ExporterHealth) -> Iterator[Family]:
    build = Family("gpulens_exporter_build_info", "The gpulens version; always 1.", labels=["version"])
    build.add_metric([gpulens.__version__], 1)
    yield build
    duration = Family("gpulens_exporter_collect_duration_seconds", "Duration of the last collection (seconds).")
    if health.collect_duration_seconds is not None:
        duration.add_metric([], health.collect_duration_seconds)
    yield duration
    errors = Family(
        "gpulens_exporter_collect_errors_total",
        "Collection failures by reason since start.",
        labels=["reason"],
        type="counter",
    )
    for reason, count in sorted(health.collect_errors.items()):
        errors.add_metric([reason], count)
    yield errors
    last = Family(
        "gpulens_exporter_last_collect_timestamp_seconds", "Time of the last successful collection (Unix seconds)."
    )
    if health.last_collect_timestamp_seconds is not None:
        last.add_metric([], health.last_collect_timestamp_seconds)
    yield last
    stale = Family(
        "gpulens_exporter_reader_stale",
        "1 while a reader's part of the readings (gpus, pods, fabric) is late: served as last read, with its age.",
        labels=["reader"],
    )
    age = Family(
        "gpulens_exporter_reader_age_seconds",
        "Seconds since a reader (gpus, pods, fabric) last succeeded; absent before its first success.",
        labels=["reader"],
    )
    for reader, state in sorted(health.readers.items()):
        stale.add_metric([reader], 1 if state.stale else 0)
        if state.age_s is not None:
            age.add_metric([reader], state.age_s)
    yield stale
    yield age


NVML_SOURCES: Final = ("nvml", "sim")  # the sources whose snapshots say whether NVML is hung


def _node_families(snapshot: NodeSnapshot) -> Iterator[Family]:
    hung = Family(
        "gpulens_node_nvml_hung",
        "1 while an NVML call of this node has passed its deadline and NVML has not answered since (the driver is "
        "hung: GpuDriverHung); 0 while NVML answers. Absent where the source is not NVML.",
        labels=["node"],
    )
    if snapshot.source in NVML_SOURCES:
        hung.add_metric([snapshot.node], 0 if snapshot.nvml_hung_since is None else 1)
    yield hung


# --- dcgm-exporter compatible families (--dcgm-compat) -----------------------------------------------------------


def _pod_labels(job: GpuJob) -> tuple[str, str, str] | None:
    """(container, namespace, pod) of a Kubernetes job: from the kubelet where it named the pod, else from the job
    id, ``<namespace>/<pod>`` (dcgm source) or ``pod/<uid>`` (cgroup)."""
    if job.pod is not None:
        return (job.container or "", job.namespace or "", job.pod)
    head, sep, tail = job.job_id.partition("/")
    if not sep or not tail or head == "docker":
        return None
    return ("", "", tail) if head == "pod" else ("", head, tail)


def _dcgm_families(snapshot: NodeSnapshot, last_xid: Mapping[str, int]) -> Iterator[Family]:
    """dcgm-exporter's families, defined by the rows of ``gpulens.dcgmfields`` that carry a compat HELP text.

    Labels as dcgm-exporter writes them, with ``DCGM_FI_DRIVER_VERSION`` and the Kubernetes ``container``,
    ``namespace`` and ``pod`` (empty where no pod holds the GPU; the first pod where several share it). A MIG
    instance adds FB_USED/FB_FREE series of its own, labelled ``GPU_I_PROFILE`` and ``GPU_I_ID`` and with the pod
    that runs on that instance.
    """
    up_gpus = [g for g in snapshot.gpus if g.up]
    pods: dict[str, tuple[str, str, str]] = {}  # by GPU UUID, and by MIG UUID for a pod on a MIG instance
    for job in snapshot.jobs:
        pod = _pod_labels(job)
        if pod is not None:
            if job.mig_uuid is not None:
                pods.setdefault(job.mig_uuid, pod)
            pods.setdefault(job.uuid, pod)
    migs = {g.uuid: [m for m in snapshot.migs if m.uuid == g.uuid] for g in up_gpus}

    def labels(g: GpuReading, mig: MigReading | None = None) -> str:
        driver = g.driver_version or snapshot.driver_version or ""
        container, namespace, pod = pods.get(g.uuid if mig is None else mig.mig_uuid, ("", "", ""))
        values = [str(g.gpu), g.uuid, g.pci_bus_id or "", f"nvidia{g.gpu}", g.model, g.node, driver]
        values += [container, namespace, pod]
        text = render_labels(COMPAT_LABELS, values)
        if mig is None:
            return text
        return text + "," + render_labels(("GPU_I_PROFILE", "GPU_I_ID"), (mig.profile or "", str(mig.gpu_instance_id)))

    for row in COMPAT_FIELDS:
        # dcgm-exporter's names are kept byte for byte; its cumulative fields lack the _total suffix that a
        # Prometheus counter needs, so every family is declared a gauge (PromQL's rate() works on either).
        family = Family(row.compat_name, row.compat_help or "")
        for g in up_gpus:
            value = compat_value(row, g, last_xid)
            if value is not None:
                family.add_rendered(labels(g), value)
            if row.target not in MIG_MEMORY_TARGETS:
                continue
            for m in migs[g.uuid]:
                mig_value = mig_memory_value(row, m)
                if mig_value is not None:
                    family.add_rendered(labels(g, m), mig_value)
        yield family


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


def render_metrics(
    snapshot: NodeSnapshot | None,
    health: ExporterHealth,
    *,
    dcgm_compat: bool = False,
    last_xid: Mapping[str, int] | None = None,
    process_pids: bool = False,
) -> bytes:
    """The Prometheus text exposition (format 0.0.4) of a snapshot (``None``: only the exporter's own families).
    ``process_pids``: one process memory series per process (``pid`` and ``command`` labels), not per job."""
    families: list[Iterable[Family]] = []
    if snapshot is not None:
        families.append(_gpulens_families(snapshot, process_pids=process_pids))
        families.append(fabric_families(snapshot))
        families.append(nccl_families(snapshot))
        families.append(inspector_families(snapshot))
        families.append(kernel_families(snapshot))
        families.append(hardware_families(snapshot))
        families.append(_node_families(snapshot))
        if dcgm_compat:
            families.append(_dcgm_families(snapshot, last_xid or {}))
    families.append(_exporter_families(health))
    return "".join(family.render() for group in families for family in group).encode()
