"""Build gpulens records from one dcgm-exporter ``/metrics`` page: ``parse_dcgm_metrics`` (page -> ``DcgmParse``).

``parse_dcgm_metrics`` is pure: Prometheus text in, ``DcgmParse`` out. It lives in the core because both the exporter's
``dcgm`` source and the collector (for ``kind = "dcgm"`` targets) read dcgm-exporter pages. The text format is read by
``gpulens.promtext``; names, units and sentinels come from the field table ``gpulens.dcgmfields``.

Rules (each one is a decision; the tests hold the code to them):

* **Units are fixed by the metric name** (see ``gpulens.dcgmfields``). A value written in the wrong unit for its name
  lands outside the plausible range below and is dropped and counted, not stored.
* **Precedence.** When several names feed one field, the base-unit (4.6+/4.9) name wins over the legacy one, the
  enforced power limit over the management limit, and a GPU-level sample over a MIG instance's copy; among equals
  the first sample wins (a GPU shared by several pods repeats each value once per pod).
* **Sentinels.** DCGM's blank / not-found / not-supported / not-permissioned values are dropped (``None``) and
  counted as ``dcgm_sentinel`` (``gpulens.dcgmfields.is_dcgm_sentinel``).
* **Plausibility.** After conversion every value must be finite, non-negative and inside a per-quantity range
  (ratios <= 1, temperatures <= 200 C, power <= 10 kW, clocks <= 100 GHz, rates <= 10 TB/s, memory <= 1 PiB,
  PCIe gen <= 16, width <= 64); integer fields must be whole. Anything else is ``dcgm_absurd_value``.
* **NVLink totals.** ``DCGM_FI_PROF_NVLINK_TX/RX_BYTES`` give tx/rx directly. Only when neither exists for a GPU,
  a total (``..._NVLINK_BANDWIDTH_TOTAL`` / ``..._THROUGHPUT_TOTAL`` / ``..._THROUGHPUT_BYTES_PER_SECOND``), which
  counts both directions, is split evenly into tx and rx: the sum stays right and a stall (traffic falling to
  zero) stays visible, while the split itself is an assumption.
* **Memory total.** ``FB_TOTAL`` / ``FB_CAPACITY_BYTES`` where exported, else used + free + reserved (reserved
  counted as 0 when absent), else ``None``.
* **MIG.** A sample with ``GPU_I_ID`` belongs to its parent GPU (``gpu``/``UUID``). Memory fields fill that
  instance's ``MigReading`` (its ``mig_uuid`` is ``MIG-<parent UUID>/<GPU_I_ID>``: dcgm-exporter exports no MIG
  UUID); utilization and profiling values are per instance and have no place on the parent, so they are not
  used; every other field is device-wide and fills the parent when no GPU-level sample did.
* **Identity.** ``gpu`` (index), ``UUID``, ``modelName``, ``pci_bus_id``. A known metric without a usable
  ``gpu``/``UUID`` is ``dcgm_bad_identity``. A UUID seen again with another index, or an index claimed by a
  second UUID, is a duplicate GPU: counted once per (UUID, index) as ``dcgm_duplicate_gpu``, later samples
  dropped. Samples of other DCGM entities (``nvswitch``, ``nvlink``/``link``, ``cpu``, ``cpucore`` labels) are
  ignored, as are names this module does not know.
* **Jobs.** Non-empty ``pod`` gives ``GpuJob(job_id="<namespace>/<pod>")`` (just ``<pod>`` without a
  namespace); non-empty ``hpc_job`` gives ``GpuJob(job_id=hpc_job)``.
* **Node.** The ``node`` argument, else the first ``hostname`` (4.6+) or ``Hostname`` label, else ``None``
  (records then carry ``fallback_node``; ``DcgmSource`` passes ``socket.gethostname()``).
* **XIDs.** ``DCGM_FI_DEV_XID_ERRORS`` / ``DCGM_FI_DEV_XID_ERROR`` hold the last XID seen (sticky), not a count.
  The parse reports that value per GPU; ``DcgmSource`` counts an event each time it changes to a non-zero code
  (43 -> 0 -> 43 counts twice; a missing read keeps the previous code). The first value seen after start-up
  counts once if it is non-zero: an XID still showing at start-up is evidence of a fault we should not hide,
  though it may predate the exporter. A repeat of the same code between two reads cannot be seen.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from gpulens.dcgmfields import BY_NAME, FREE, NVLINK_TOTAL, XID_TARGET, NameSpec, is_dcgm_sentinel
from gpulens.model import GpuJob, GpuReading, MigReading
from gpulens.promtext import LineStats, Sample, read_samples

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
_NOT_READING_FIELDS: Final = frozenset({FREE, NVLINK_TOTAL, XID_TARGET})
_OTHER_ENTITY_LABELS: Final = ("nvswitch", "nvlink", "link", "cpu", "cpucore")
_DRIVER_LABELS: Final = ("DCGM_FI_SYSTEM_DRIVER_VERSION", "DCGM_FI_DRIVER_VERSION")
_HOSTNAME_LABELS: Final = ("hostname", "Hostname")
_INDEX_RE: Final = re.compile(r"[0-9]{1,9}")

# Error reasons (NodeSnapshot.errors keys).
BAD_LINES: Final = "dcgm_bad_lines"
SENTINEL: Final = "dcgm_sentinel"
ABSURD_VALUE: Final = "dcgm_absurd_value"
DUPLICATE_GPU: Final = "dcgm_duplicate_gpu"
BAD_IDENTITY: Final = "dcgm_bad_identity"
FETCH_FAILED: Final = "dcgm_fetch_failed"


@dataclass(frozen=True, slots=True)
class DcgmParse:
    """What one dcgm-exporter page held, in gpulens records and units."""

    node: str | None
    gpus: tuple[GpuReading, ...]
    migs: tuple[MigReading, ...]
    jobs: tuple[GpuJob, ...]
    driver_version: str | None
    # GPU UUID -> the last XID DCGM reported (0: none); DcgmSource turns it into counters.
    last_xid: Mapping[str, int]
    samples: int  # well-formed sample lines, known names or not
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


def _convert(spec: NameSpec, raw: float) -> _Value | str:
    """The value in our units, or the problem reason (a ``str``) when it must be dropped."""
    if not math.isfinite(raw):
        return ABSURD_VALUE
    if is_dcgm_sentinel(raw):
        return SENTINEL
    value = raw * spec.name.multiply / spec.name.divide + 0.0  # + 0.0 turns -0.0 into 0.0
    quantity = spec.field.quantity
    if not 0.0 <= value <= quantity.high:
        return ABSURD_VALUE
    if quantity.kind == "float":
        return value
    if not value.is_integer():
        return ABSURD_VALUE
    return int(value) if quantity.kind == "int" else value == 1.0


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

    def __init__(self) -> None:
        self.gpus: dict[str, _Gpu] = {}
        self.index_owner: dict[int, str] = {}
        self.duplicates: set[tuple[str, int]] = set()
        self.jobs: dict[tuple[str, str], int] = {}  # (UUID, job id) -> GPU index, in order of appearance
        self.hostname: str | None = None
        self.driver_version: str | None = None
        self.problems: dict[str, int] = {}

    def problem(self, reason: str) -> None:
        self.problems[reason] = self.problems.get(reason, 0) + 1

    def add(self, sample: Sample) -> None:
        labels = sample.labels
        if self.hostname is None:
            self.hostname = next((labels[k] for k in _HOSTNAME_LABELS if labels.get(k)), None)
        spec = BY_NAME.get(sample.name)
        if spec is None or any(k in labels for k in _OTHER_ENTITY_LABELS):
            return
        instance = labels.get("GPU_I_ID", "")
        if instance and not _INDEX_RE.fullmatch(instance):
            self.problem(BAD_IDENTITY)
            return
        gpu = self._gpu_for(labels)
        if gpu is None:
            return
        self._note_jobs(gpu, labels)
        mig = self._mig(gpu, int(instance), labels) if instance else None
        value = _convert(spec, sample.value)
        if isinstance(value, str):
            self.problem(value)
        elif mig is None:
            gpu.values.offer(spec.target, (True, spec.name.rank), value)
        else:
            if spec.target in _MIG_MEMORY_TARGETS:
                mig.values.offer(spec.target, (True, spec.name.rank), value)
            if spec.target not in _MIG_LOCAL_TARGETS:
                gpu.values.offer(spec.target, (False, spec.name.rank), value)

    def _gpu_for(self, labels: Mapping[str, str]) -> _Gpu | None:
        index_text, uuid = labels.get("gpu", ""), labels.get("UUID", "")
        if not uuid or not _INDEX_RE.fullmatch(index_text):
            self.problem(BAD_IDENTITY)
            return None
        index = int(index_text)
        gpu = self.gpus.get(uuid)
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

    def _note_jobs(self, gpu: _Gpu, labels: Mapping[str, str]) -> None:
        pod, namespace, hpc_job = labels.get("pod", ""), labels.get("namespace", ""), labels.get("hpc_job", "")
        if pod:
            job_id = f"{namespace}/{pod}" if namespace else pod
            self.jobs.setdefault((gpu.uuid, job_id), gpu.index)
        if hpc_job:
            self.jobs.setdefault((gpu.uuid, hpc_job), gpu.index)

    def _reading(self, gpu: _Gpu, node: str, timestamp: float) -> GpuReading:
        fields: dict[str, Any] = {
            target: value for target, (_, value) in gpu.values.items.items() if target not in _NOT_READING_FIELDS
        }
        fields["memory_total_bytes"] = _memory_total(gpu.values)
        total = gpu.values.get(NVLINK_TOTAL)
        no_direction = "nvlink_tx_bytes_per_second" not in fields and "nvlink_rx_bytes_per_second" not in fields
        if total is not None and no_direction:
            fields["nvlink_tx_bytes_per_second"] = fields["nvlink_rx_bytes_per_second"] = total / 2
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
            GpuJob(node=record_node, gpu=index, uuid=uuid, job_id=job_id) for (uuid, job_id), index in self.jobs.items()
        ]
        return DcgmParse(
            node=resolved,
            gpus=tuple(self._reading(gpu, record_node, timestamp) for gpu in gpus),
            migs=tuple(migs),
            jobs=tuple(jobs),
            driver_version=self.driver_version,
            last_xid={g.uuid: g.values.get(XID_TARGET) for g in gpus if g.values.get(XID_TARGET) is not None},
            samples=parse.samples,
            bad_lines=sum(parse.bad_reasons.values()),
            bad_line_reasons=dict(parse.bad_reasons),
            first_bad_line=parse.first_bad_line,
            problems=dict(self.problems),
        )


def dcgm_records(
    samples: Iterable[Sample], *, node: str | None, timestamp: float, fallback_node: str = ""
) -> DcgmParse:
    """Build records from samples already parsed (a Prometheus query's result, for example), by the same rules."""
    builder = _Builder()
    for sample in samples:
        builder.add(sample)
    return builder.finish(node=node, timestamp=timestamp, fallback_node=fallback_node, parse=LineStats())


def parse_dcgm_metrics(text: str, *, node: str | None, timestamp: float, fallback_node: str = "") -> DcgmParse:
    """Parse a dcgm-exporter ``/metrics`` page. Never raises on bad content: bad lines are counted and skipped.

    ``node`` overrides the hostname label; records carry ``fallback_node`` when neither names the node.
    """
    builder = _Builder()
    stats = LineStats()
    for sample in read_samples(text, stats):
        builder.add(sample)
    return builder.finish(node=node, timestamp=timestamp, fallback_node=fallback_node, parse=stats)
