"""Build gpulens records from one dcgm-exporter ``/metrics`` page: ``parse_dcgm_metrics`` (page -> ``DcgmParse``).

``parse_dcgm_metrics`` is pure: Prometheus text in, ``DcgmParse`` out. It lives in the core because both the exporter's
``dcgm`` source and the collector (for ``kind = "dcgm"`` targets) read dcgm-exporter pages. The text format is read by
``gpulens.promtext``; names, units and sentinels come from the field table ``gpulens.dcgmfields``.

Rules (each one is a decision; the tests hold the code to them):

* **Units are fixed by the DCGM field id** behind the name (see ``gpulens.dcgmfields``): every generation of names
  (DCGM 4.6 names, their deprecated 2.x-4.5 aliases, ``--use-old-namespace``/1.x names) carries its field's unit,
  except where the family's HELP announces the base unit of a field DCGM scales ("(in Hz)" over SM_CLOCK, "(in B)"
  over FB_USED, "(in J)" over TOTAL_ENERGY_CONSUMPTION). A value written in another unit lands outside the
  plausible range below and is dropped and counted, not stored.
* **Precedence.** When several fields feed one target, the higher-ranked field wins (GPU_UTIL over
  GR_ENGINE_ACTIVE, the enforced power limit over the requested one, PROF PCIe bytes over PCIE_*_THROUGHPUT), and a
  GPU-level sample over a MIG instance's copy; among equals the first sample wins (a GPU shared by several pods
  repeats each value once per pod).
* **Sentinels.** DCGM's blank / not-found / not-supported / not-permissioned values are dropped (``None``) and
  counted as ``dcgm_sentinel`` (``gpulens.dcgmfields.is_dcgm_sentinel``). Memory temperature 0 (GDDR boards: T4,
  L4, L40S have no sensor) is unknown: dropped, not counted.
* **Plausibility.** After conversion every value must be finite, non-negative and inside its field's range (the
  metric catalogue's ``range`` column: ratios <= 1, temperatures <= 200 C and so on, ``metriccatalogue.QUANTITIES``);
  integer fields must be whole. Anything else is ``dcgm_absurd_value``. A plausible value that storage cannot hold
  (``gpulens.storedrange``: a counter over 2^31 - 1, say) is dropped alone as ``dcgm_value_out_of_range``.
* **NVLink totals.** ``DCGM_FI_PROF_NVLINK_TX/RX_BYTES`` give tx/rx directly. Only when neither exists for a GPU,
  the total (field 449, ``..._NVLINK_THROUGHPUT_TOTAL`` / ``..._BANDWIDTH_TOTAL``), which counts both directions, is
  split evenly into tx and rx: the sum stays right and a stall stays visible, while the split is an assumption.
* **Memory total.** ``FB_TOTAL`` where exported, else used + free + reserved (reserved counted as 0 when absent),
  else ``None``.
* **MIG.** A sample with ``GPU_I_ID`` belongs to its parent GPU (``gpu``/``UUID``). Memory fields fill that
  instance's ``MigReading`` (its ``mig_uuid`` is ``MIG-<parent UUID>/<GPU_I_ID>``: dcgm-exporter exports no MIG
  UUID); profiling values are per instance and are not copied to the parent, except utilization: a parent without a
  GPU-level utilization gets its instances' (GR_ENGINE_ACTIVE, the utilization NVIDIA recommends on MIG), weighted
  by their compute slices (``3g.40gb`` = 3). Every other field is device-wide and fills the parent when no
  GPU-level sample did.
* **Identity.** ``gpu`` (index), ``UUID`` (``uuid`` with ``--use-old-namespace``), ``modelName``, ``pci_bus_id``.
  A known metric without a usable ``gpu``/UUID is ``dcgm_bad_identity``. A UUID seen again with another index, or an
  index claimed by a second UUID, is a duplicate GPU: counted once per (UUID, index) as ``dcgm_duplicate_gpu``,
  later samples dropped. A GPU index storage cannot hold (over 32767) is ``dcgm_gpu_index_out_of_range``; GPUs past
  ``GPUS_PER_TARGET`` are ``dcgm_gpu_limit`` (each counted once). Samples of other DCGM entities (``nvswitch``,
  ``nvlink``/``link``, ``cpu``, ``cpucore`` labels) are ignored, as are names this module does not know.
* **Jobs.** Non-empty ``pod`` (``pod_name``) gives ``GpuJob(job_id="<namespace>/<pod>")`` (just ``<pod>`` without
  a namespace); non-empty ``hpc_job`` gives ``GpuJob(job_id=hpc_job)``. A job seen on a MIG instance's series stays
  on that instance: its ``mig_uuid`` is the instance's (``MIG-<parent UUID>/<GPU_I_ID>``).
* **Node.** The ``node`` argument, else the first ``hostname`` (newer) or ``Hostname`` label, else ``None``. Which
  node a page belongs to is decided by the page's reader (``gpulens.dcgmnode``), which prefers configuration.
* **The text's limits** (``gpulens.promtext.TextLimits``) are counted as ``dcgm_<reason>`` (``dcgm_line_too_long``,
  ``dcgm_label_value_too_long``, ``dcgm_too_many_labels``, ``dcgm_series_limit``); a last line without its line
  feed is never used and counted as ``dcgm_truncated``.
* **XIDs.** ``DCGM_FI_DEV_XID_ERRORS`` / ``DCGM_FI_DEV_XID_ERROR`` hold the last XID seen (sticky), not a count: the
  parse reports it per GPU. ``DCGM_EXP_XID_ERRORS_COUNT`` (label ``xid``; ``err_code`` accepted too) counts the XIDs
  of each code within dcgm-exporter's window: the parse reports code -> count per GPU. ``gpulens.dcgmnode`` turns
  both into counters.
* **dcgm-exporter's own series** (``DCGM_EXP_*``, read by ``gpulens.dcgmexp``): the XID and clock-event window counts
  are reported per GPU; the health status and peer-to-peer status fill ``health_status`` and ``p2p_peers_ok``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from gpulens.dcgmexp import EXP_NAMES, ExpSeries
from gpulens.dcgmfields import (
    BY_NAME,
    FREE,
    MEM_COPY,
    NVLINK_TOTAL,
    XID_COUNT_NAME,
    XID_TARGET,
    NameSpec,
    help_factor,
    is_dcgm_sentinel,
)
from gpulens.model import GpuJob, GpuReading, MigReading
from gpulens.promtext import DEFAULT_LIMITS, LineStats, Sample, TextLimits, read_samples
from gpulens.storedrange import GPU_INDEX_MAX, GPUS_PER_TARGET, storable

# Per MIG instance: these describe the instance, not the GPU.
_MIG_MEMORY_TARGETS: Final = frozenset({"memory_used_bytes", FREE, "memory_reserved_bytes", "memory_total_bytes"})
_MIG_LOCAL_TARGETS: Final = _MIG_MEMORY_TARGETS | {
    "utilization_ratio",
    "sm_active_ratio",
    "tensor_active_ratio",
    "dram_active_ratio",
    "pcie_tx_bytes_per_second",
    "pcie_rx_bytes_per_second",
    "nvlink_tx_bytes_per_second",
    "nvlink_rx_bytes_per_second",
}
_NOT_READING_FIELDS: Final = frozenset({FREE, NVLINK_TOTAL, XID_TARGET, MEM_COPY})
__all__ = ["XID_COUNT_NAME", "DcgmParse", "dcgm_records", "parse_dcgm_metrics"]
_UUID_LABELS: Final = ("UUID", "uuid")  # uuid: --use-old-namespace and 1.x
_OTHER_ENTITY_LABELS: Final = ("nvswitch", "nvlink", "link", "cpu", "cpucore")
_DRIVER_LABELS: Final = ("DCGM_FI_SYSTEM_DRIVER_VERSION", "DCGM_FI_DRIVER_VERSION")
_HOSTNAME_LABELS: Final = ("hostname", "Hostname")
_POD_LABELS: Final = (("pod", "namespace"), ("pod_name", "pod_namespace"))  # pod_*: --use-old-namespace
_INDEX_RE: Final = re.compile(r"[0-9]{1,9}")
_SLICES_RE: Final = re.compile(r"([1-8])g\.")

# Error reasons (NodeSnapshot.errors keys).
BAD_LINES: Final = "dcgm_bad_lines"
SENTINEL: Final = "dcgm_sentinel"
ABSURD_VALUE: Final = "dcgm_absurd_value"
DUPLICATE_GPU: Final = "dcgm_duplicate_gpu"
BAD_IDENTITY: Final = "dcgm_bad_identity"
FETCH_FAILED: Final = "dcgm_fetch_failed"
OUT_OF_RANGE: Final = "dcgm_value_out_of_range"
GPU_INDEX_OUT_OF_RANGE: Final = "dcgm_gpu_index_out_of_range"
GPU_LIMIT: Final = "dcgm_gpu_limit"


@dataclass(frozen=True, slots=True)
class DcgmParse:
    """What one dcgm-exporter page held, in gpulens records and units."""

    node: str | None
    gpus: tuple[GpuReading, ...]
    migs: tuple[MigReading, ...]
    jobs: tuple[GpuJob, ...]
    driver_version: str | None
    # GPU UUID -> the last XID DCGM reported (0: none); the converter (gpulens.dcgmnode) turns it into counters.
    last_xid: Mapping[str, int]
    # GPU UUID -> XID code -> events within dcgm-exporter's window (DCGM_EXP_XID_ERRORS_COUNT), where served.
    xid_window_counts: Mapping[str, Mapping[int, int]]
    # GPU UUID -> clock-event reason bit -> samples within dcgm-exporter's window (DCGM_EXP_CLOCK_EVENTS_COUNT).
    clock_event_counts: Mapping[str, Mapping[int, int]]
    samples: int  # well-formed sample lines, known names or not
    gpu_samples: int  # samples that fed a GPU (known names with a GPU identity)
    example_name: str | None  # the first sample's name, to tell the operator what an unreadable page held
    truncated: bool  # the last line had no line feed: it was not used (counted as dcgm_truncated)
    bad_lines: int
    bad_line_reasons: Mapping[str, int]  # e.g. "bad_labels", "bad_value", "duplicate_series"
    first_bad_line: int | None  # 1-based line number, for the log
    # Sample-level problems by NodeSnapshot error reason (dcgm_sentinel, dcgm_absurd_value, ...).
    problems: Mapping[str, int]

    def error_counts(self) -> dict[str, int]:
        """This page's problems keyed as in ``NodeSnapshot.errors`` (zero counts left out)."""
        counts = {BAD_LINES: self.bad_lines, **self.problems}
        return {reason: n for reason, n in counts.items() if n}


_Priority = tuple[bool, int]  # (from a GPU-level sample, rank of the name)
_Value = float | int | bool


@dataclass(slots=True)
class _Values:
    """Field values of one GPU or MIG instance, each with the priority of the sample that gave it."""

    items: dict[str, tuple[_Priority, _Value]] = field(default_factory=dict)

    def offer(self, target: str, priority: _Priority, value: _Value) -> None:
        held = self.items.get(target)
        if held is None or priority > held[0]:
            self.items[target] = (priority, value)

    def get(self, target: str) -> Any:
        held = self.items.get(target)
        return None if held is None else held[1]


@dataclass(slots=True)
class _Mig:
    profile: str | None
    values: _Values = field(default_factory=_Values)


@dataclass(slots=True)
class _Gpu:
    index: int
    uuid: str
    model: str | None = None
    pci_bus_id: str | None = None
    driver_version: str | None = None
    values: _Values = field(default_factory=_Values)
    migs: dict[int, _Mig] = field(default_factory=dict)


def _convert(spec: NameSpec, raw: float, factor: float | None = None) -> _Value | str:
    """The value in our units, or the problem reason (a ``str``) when it must be dropped.

    ``factor``: the page announced another unit for this family in its HELP (``gpulens.dcgmfields.help_factor``).
    """
    if not math.isfinite(raw):
        return ABSURD_VALUE
    if is_dcgm_sentinel(raw):
        return SENTINEL
    row = spec.field
    value = (raw * row.multiply / row.divide if factor is None else raw * factor) + 0.0  # -0.0 becomes 0.0
    quantity = row.quantity
    if not 0.0 <= value <= quantity.high:
        return ABSURD_VALUE
    if not storable(spec.target, value):
        return OUT_OF_RANGE
    if quantity.kind == "float":
        return value
    if not value.is_integer():
        return ABSURD_VALUE
    return int(value) if quantity.kind == "int" else value == 1.0


def _mig_slices(profile: str | None) -> int:
    """Compute slices of a MIG profile: ``3g.40gb`` -> 3 (1 when the profile is unknown)."""
    match = _SLICES_RE.match(profile or "")
    return int(match.group(1)) if match else 1


def _mig_utilization(gpu: _Gpu) -> float | None:
    """The parent's utilization from its instances' (GR_ENGINE_ACTIVE), weighted by compute slices.

    Counted over the instances that report a value: the share of the instantiated compute that is busy.
    """
    weighted = [(mig.values.get("utilization_ratio"), _mig_slices(mig.profile)) for mig in gpu.migs.values()]
    known: list[tuple[float, int]] = [(float(value), slices) for value, slices in weighted if value is not None]
    if not known:
        return None
    return min(1.0, sum(value * slices for value, slices in known) / sum(slices for _, slices in known))


def _memory_total(values: _Values) -> int | None:
    total: int | None = values.get("memory_total_bytes")
    if total is not None:
        return total
    used, free = values.get("memory_used_bytes"), values.get(FREE)
    if used is None or free is None:
        return None
    return int(used + free + (values.get("memory_reserved_bytes") or 0))


class _Builder:
    """Accumulates samples into per-GPU state, then builds the records."""

    def __init__(self, help_texts: Mapping[str, str]) -> None:
        self.help_texts = help_texts  # filled as the page is read: a family's HELP precedes its samples
        self.gpus: dict[str, _Gpu] = {}
        self.index_owner: dict[int, str] = {}
        self.duplicates: set[tuple[str, int]] = set()
        # (UUID, job id) -> (GPU index, MIG instance id or None), in order of appearance
        self.jobs: dict[tuple[str, str], tuple[int, int | None]] = {}
        self.hostname: str | None = None
        self.driver_version: str | None = None
        self.problems: dict[str, int] = {}
        self.exp: dict[str, ExpSeries] = {}
        self.gpu_samples = 0
        self.example_name: str | None = None
        self.refused: set[str] = set()  # UUIDs past GPUS_PER_TARGET

    def problem(self, reason: str) -> None:
        self.problems[reason] = self.problems.get(reason, 0) + 1

    def add(self, sample: Sample) -> None:
        labels = sample.labels
        self.example_name = self.example_name or sample.name
        if self.hostname is None:
            self.hostname = next((labels[k] for k in _HOSTNAME_LABELS if labels.get(k)), None)
        if any(k in labels for k in _OTHER_ENTITY_LABELS):
            return
        if sample.name in EXP_NAMES:
            self._exp(sample)
            return
        spec = BY_NAME.get(sample.name)
        if spec is None:
            return
        instance = labels.get("GPU_I_ID", "")
        if instance and not _INDEX_RE.fullmatch(instance):
            self.problem(BAD_IDENTITY)
            return
        gpu = self._gpu_for(labels)
        if gpu is None:
            return
        self.gpu_samples += 1
        self._note_jobs(gpu, labels, int(instance) if instance else None)
        mig = self._mig(gpu, int(instance), labels) if instance else None
        if spec.field.zero_is_blank and sample.value == 0:
            return  # no sensor (memory temperature on GDDR boards): unknown, not 0
        value = _convert(spec, sample.value, help_factor(spec.field, self.help_texts.get(sample.name)))
        rank = spec.field.rank
        if isinstance(value, str):
            self.problem(value)
        elif mig is None:
            gpu.values.offer(spec.target, (True, rank), value)
        else:
            if spec.target in _MIG_MEMORY_TARGETS or spec.target == "utilization_ratio":
                mig.values.offer(spec.target, (True, rank), value)
            if spec.target not in _MIG_LOCAL_TARGETS:
                gpu.values.offer(spec.target, (False, rank), value)

    def _exp(self, sample: Sample) -> None:
        """One sample of dcgm-exporter's own series (``gpulens.dcgmexp``), for the GPU it names."""
        gpu = self._gpu_for(sample.labels)
        if gpu is None:
            return
        problem = self.exp.setdefault(gpu.uuid, ExpSeries()).add(sample)
        if problem is not None:
            self.problem(problem)

    def _gpu_for(self, labels: Mapping[str, str]) -> _Gpu | None:
        index_text = labels.get("gpu", "")
        uuid = next((labels[k] for k in _UUID_LABELS if labels.get(k)), "")
        if not uuid or not _INDEX_RE.fullmatch(index_text):
            self.problem(BAD_IDENTITY)
            return None
        index = int(index_text)
        if index > GPU_INDEX_MAX:
            self.problem(GPU_INDEX_OUT_OF_RANGE)
            return None
        gpu = self.gpus.get(uuid)
        if gpu is None and len(self.gpus) >= GPUS_PER_TARGET:
            if uuid not in self.refused:
                self.refused.add(uuid)
                self.problem(GPU_LIMIT)
            return None
        if gpu is None and index not in self.index_owner:
            gpu = self.gpus[uuid] = _Gpu(index, uuid)
            self.index_owner[index] = uuid
        elif gpu is None or gpu.index != index:
            if (uuid, index) not in self.duplicates:
                self.duplicates.add((uuid, index))
                self.problem(DUPLICATE_GPU)
            return None
        gpu.model = gpu.model or labels.get("modelName") or None
        gpu.pci_bus_id = gpu.pci_bus_id or labels.get("pci_bus_id") or None
        driver = next((labels[k] for k in _DRIVER_LABELS if labels.get(k)), None)
        gpu.driver_version = gpu.driver_version or driver
        self.driver_version = self.driver_version or driver
        return gpu

    @staticmethod
    def _mig(gpu: _Gpu, instance: int, labels: Mapping[str, str]) -> _Mig:
        mig = gpu.migs.get(instance)
        if mig is None:
            mig = gpu.migs[instance] = _Mig(labels.get("GPU_I_PROFILE") or None)
        return mig

    def _note_jobs(self, gpu: _Gpu, labels: Mapping[str, str], instance: int | None) -> None:
        pod, namespace = next(((labels[p], labels.get(n, "")) for p, n in _POD_LABELS if labels.get(p)), ("", ""))
        hpc_job = labels.get("hpc_job", "")
        if pod:
            job_id = f"{namespace}/{pod}" if namespace else pod
            self.jobs.setdefault((gpu.uuid, job_id), (gpu.index, instance))
        if hpc_job:
            self.jobs.setdefault((gpu.uuid, hpc_job), (gpu.index, instance))

    def _reading(self, gpu: _Gpu, node: str, timestamp: float) -> GpuReading:
        fields: dict[str, Any] = {
            target: value for target, (_, value) in gpu.values.items.items() if target not in _NOT_READING_FIELDS
        }
        fields["memory_total_bytes"] = _memory_total(gpu.values)
        total = gpu.values.get(NVLINK_TOTAL)
        no_direction = "nvlink_tx_bytes_per_second" not in fields and "nvlink_rx_bytes_per_second" not in fields
        if total is not None and no_direction:
            fields["nvlink_tx_bytes_per_second"] = fields["nvlink_rx_bytes_per_second"] = total / 2
        if "utilization_ratio" not in fields:
            fields["utilization_ratio"] = _mig_utilization(gpu)
        exp = self.exp.get(gpu.uuid)
        if exp is not None:
            fields["health_status"], fields["p2p_peers_ok"] = exp.health_status, exp.p2p_peers_ok
        return GpuReading(
            node=node,
            gpu=gpu.index,
            uuid=gpu.uuid,
            model=gpu.model or "unknown",
            timestamp=timestamp,
            pci_bus_id=gpu.pci_bus_id,
            driver_version=gpu.driver_version,
            mig_enabled=True if gpu.migs else None,
            **fields,
        )

    def finish(self, *, node: str | None, timestamp: float, fallback_node: str, parse: LineStats) -> DcgmParse:
        resolved = node or self.hostname
        record_node = resolved or fallback_node
        gpus = sorted(self.gpus.values(), key=lambda g: g.index)
        migs = [
            MigReading(
                node=record_node,
                gpu=gpu.index,
                uuid=gpu.uuid,
                mig_uuid=f"MIG-{gpu.uuid}/{instance}",
                gpu_instance_id=instance,
                profile=mig.profile,
                memory_used_bytes=mig.values.get("memory_used_bytes"),
                memory_total_bytes=_memory_total(mig.values),
            )
            for gpu in gpus
            for instance, mig in sorted(gpu.migs.items())
        ]
        jobs = [
            GpuJob(
                node=record_node,
                gpu=index,
                uuid=uuid,
                job_id=job_id,
                mig_uuid=None if instance is None else f"MIG-{uuid}/{instance}",
            )
            for (uuid, job_id), (index, instance) in self.jobs.items()
        ]
        return DcgmParse(
            node=resolved,
            gpus=tuple(self._reading(gpu, record_node, timestamp) for gpu in gpus),
            migs=tuple(migs),
            jobs=tuple(jobs),
            driver_version=self.driver_version,
            last_xid={g.uuid: g.values.get(XID_TARGET) for g in gpus if g.values.get(XID_TARGET) is not None},
            xid_window_counts={u: dict(e.xid_window) for u, e in self.exp.items() if e.xid_window is not None},
            clock_event_counts={u: dict(e.clock_events) for u, e in self.exp.items() if e.clock_events is not None},
            samples=parse.samples,
            gpu_samples=self.gpu_samples,
            example_name=self.example_name,
            truncated=parse.truncated,
            bad_lines=sum(parse.bad_reasons.values()),
            bad_line_reasons=dict(parse.bad_reasons),
            first_bad_line=parse.first_bad_line,
            problems={**self.problems, **{f"dcgm_{reason}": n for reason, n in parse.limits.items()}},
        )


def dcgm_records(
    samples: Iterable[Sample], *, node: str | None, timestamp: float, fallback_node: str = ""
) -> DcgmParse:
    """Build records from samples already parsed (a Prometheus query's result, for example), by the same rules."""
    builder = _Builder({})  # no HELP texts: a query result carries none, so units are the table's
    for sample in samples:
        builder.add(sample)
    return builder.finish(node=node, timestamp=timestamp, fallback_node=fallback_node, parse=LineStats())


def parse_dcgm_metrics(
    text: str, *, node: str | None, timestamp: float, fallback_node: str = "", limits: TextLimits = DEFAULT_LIMITS
) -> DcgmParse:
    """Parse a dcgm-exporter ``/metrics`` page. Never raises on bad content: bad lines are counted and skipped.

    ``node`` overrides the hostname label; records carry ``fallback_node`` when neither names the node.
    """
    stats = LineStats()
    builder = _Builder(stats.help)
    for sample in read_samples(text, stats, limits):
        builder.add(sample)
    return builder.finish(node=node, timestamp=timestamp, fallback_node=fallback_node, parse=stats)
