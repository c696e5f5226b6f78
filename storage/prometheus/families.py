"""Which Prometheus series hold which reading field, in both data sources, and the records built from them.

* **gpulens families** (``gpulens_gpu_*``, labels ``node``/``gpu``/``uuid``/``model``): the metric catalogue
  (``gpulens.metriccatalogue``) says which family and constant labels hold each field, in gpulens units already;
  ``gpulens_gpu_info``, ``_up``, ``_throttle_active``, ``_xid_errors_total`` and ``_job_info`` are read as the
  exporter writes them (``gpulens.exporter.metrics``).
* **dcgm-exporter families** (``DCGM_FI_*``, labels ``gpu``/``UUID``/``Hostname``...): every name of every
  generation in the DCGM field table (``gpulens.dcgmfields``, 2.x-4.5 and 4.6+ names), converted by that table and
  turned into records by the very rules that read a dcgm-exporter page (``gpulens.dcgmpage.dcgm_records``).

A GPU seen in both (an exporter run with ``--dcgm-compat``) is read from its gpulens families.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gpulens.dcgmfields import BY_NAME, FREE, NVLINK_TOTAL
from gpulens.dcgmpage import dcgm_records
from gpulens.hardware import PCIE_LANE_BYTES_PER_SECOND
from gpulens.metriccatalogue import GPU_FIELDS
from gpulens.model import THROTTLE_REASONS, THROTTLE_SOURCES, GpuJob, GpuReading
from gpulens.promtext import Sample
from gpulens.storage.prometheus.client import PromSeries, quote

INFO: Final = "gpulens_gpu_info"
UP: Final = "gpulens_gpu_up"
THROTTLE: Final = "gpulens_gpu_throttle_active"
XIDS: Final = "gpulens_gpu_xid_errors_total"
JOB_INFO: Final = "gpulens_gpu_job_info"
SCHEDULER_INFO: Final = "gpulens_job_info"  # what Slurm says of a job (the exporter's --job-info)
PROCESS: Final = "gpulens_process_gpu_memory_bytes"
LINK_ACTIVE: Final = "gpulens_gpu_nvlink_link_active"
LINKS_ACTIVE: Final = "gpulens_gpu_nvlink_links_active"  # the count per GPU
READING_FAMILIES: Final = tuple(sorted({INFO, UP, THROTTLE, XIDS} | {spec.family for spec in GPU_FIELDS}))
DCGM_NAMES: Final = tuple(sorted(BY_NAME))
# A GPU's dcgm-exporter identity is in every series; the utilization names say that a GPU exports at all.
DCGM_PRESENCE: Final = tuple(sorted(n for n, spec in BY_NAME.items() if spec.target == "utilization_ratio"))
DCGM_JOB_LABELS: Final = ("pod", "namespace", "hpc_job")
THROTTLE_BITS: Final = dict(THROTTLE_REASONS)
_TYPES: Final = {f.name: str(f.type) for f in dataclasses.fields(GpuReading)}
_HOSTNAME_LABELS: Final = ("hostname", "Hostname")


def reading_families(fields: Sequence[str] | None) -> tuple[str, ...]:
    """The gpulens families holding ``fields`` (all when None), with ``up`` always (every series names its GPU)."""
    if fields is None:
        return READING_FAMILIES
    wanted = set(fields)
    families = {UP} | {spec.family for spec in GPU_FIELDS if spec.field in wanted}
    families |= {INFO} if wanted & {"pci_bus_id", "driver_version"} else set()
    families |= {THROTTLE} if wanted & {"throttle_reasons", "throttle_reasons_source"} else set()
    families |= {XIDS} if "xid_errors" in wanted else set()
    return tuple(sorted(families))


def dcgm_names(fields: Sequence[str] | None) -> tuple[str, ...]:
    """The dcgm-exporter names holding ``fields`` (all when None), with what memory and NVLink totals derive from."""
    if fields is None:
        return DCGM_NAMES
    wanted = set(fields) | {"utilization_ratio", "memory_used_bytes", FREE, NVLINK_TOTAL, "memory_reserved_bytes"}
    return tuple(sorted(name for name, spec in BY_NAME.items() if spec.target in wanted))


def selector(names: Iterable[str], matchers: str = "") -> str:
    """``{__name__=~"a|b", <matchers>}``."""
    extra = f", {matchers}" if matchers else ""
    return "{__name__=~" + quote("|".join(sorted(set(names)))) + extra + "}"


@dataclass(frozen=True, slots=True)
class Source:
    """One series that holds a field: a metric name, its constant labels, and the factor to gpulens units."""

    name: str
    labels: tuple[tuple[str, str], ...] = ()
    factor: float = 1.0
    dcgm: bool = False
    rank: int = 0

    def selector(self, matchers: str) -> str:
        parts = [f"{k}={quote(v)}" for k, v in self.labels] + ([matchers] if matchers else [])
        return self.name + "{" + ", ".join(parts) + "}"


def sources(field: str) -> list[Source]:
    """Every series that holds ``field``: its gpulens family, then each of its dcgm-exporter names."""
    out = [Source(spec.family, spec.labels) for spec in GPU_FIELDS if spec.field == field]
    if field == "throttle_reasons":
        out.append(Source(THROTTLE))
    if field == "up":
        out.append(Source(UP))
    if field == "xid_total":  # XID events of every code (dcgm-exporter keeps only the last code: no count)
        out.append(Source(XIDS))
    for name, spec in BY_NAME.items():
        if spec.target == field:
            out.append(Source(name, (), spec.field.multiply / spec.field.divide, dcgm=True, rank=spec.field.rank))
    return out


def field_selector(field: str, matchers: str = "") -> str:
    """The gpulens series holding ``field``: ``family{constant labels, matchers}``."""
    spec = next(s for s in GPU_FIELDS if s.field == field)
    return Source(spec.family, spec.labels).selector(matchers)


def fewer_links_active(links: str) -> str:
    """PromQL: the GPUs (series of ``links``, a selector of the NVLinks-active count) with fewer NVLinks active than
    the most of any GPU of their model."""
    return f"{links} < on (model) group_left () max by (model) ({links})"


def pcie_ceiling(state: str) -> str:
    """PromQL: each GPU's PCIe ceiling in one direction (one series per ``uuid``), of its ``current`` or ``max`` link:
    its width times the per-lane rate of its generation (``hardware.PCIE_LANE_BYTES_PER_SECOND``)."""
    suffix = "" if state == "current" else "_max"
    generation = field_selector(f"pcie_link_generation{suffix}")
    rates = sorted(PCIE_LANE_BYTES_PER_SECOND.items())
    lane = " or ".join(f"({generation} == {g}) * 0 + {rate:g}" for g, rate in rates)
    return f"({field_selector(f'pcie_link_width{suffix}')} * on (uuid) ({lane}))"


def uuid_of(labels: Mapping[str, str]) -> str | None:
    return labels.get("uuid") or labels.get("UUID") or None


def dcgm_node(labels: Mapping[str, str]) -> str:
    """A dcgm-exporter series' node: its hostname label, else the host of the scrape's ``instance``."""
    named = next((labels[k] for k in _HOSTNAME_LABELS if labels.get(k)), None)
    if named:
        return named
    instance = labels.get("instance", "")
    return instance.rsplit(":", 1)[0] if ":" in instance and not instance.endswith("]") else instance


def _is_set(value: float) -> bool:
    return value != 0


# family -> [(the constant labels' names, {their values: [(field, how to type the value)]})], the specs grouped by
# the names of their constant labels: a series finds its fields by one lookup per group, not a test per spec.
_Typer = Callable[[float], Any] | None
_Table = dict[tuple[str | None, ...], list[tuple[str, _Typer]]]
_SPECS: Final[dict[str, list[tuple[tuple[str, ...], _Table]]]] = {}
for _spec in GPU_FIELDS:
    if _spec.family in (INFO, UP, THROTTLE, XIDS):  # read as the exporter writes them (``gpulens_readings``)
        continue
    _keys = tuple(k for k, _ in _spec.labels)
    _groups = _SPECS.setdefault(_spec.family, [])
    _table = next((table for keys, table in _groups if keys == _keys), None)
    if _table is None:
        _table = {}
        _groups.append((_keys, _table))
    _kind = _TYPES[_spec.field]
    _typer: _Typer = round if _kind == "int | None" else _is_set if _kind == "bool | None" else None
    _table.setdefault(tuple(v for _, v in _spec.labels), []).append((_spec.field, _typer))


def gpulens_readings(series: Sequence[PromSeries], times: Mapping[str, float], now: float) -> list[GpuReading]:
    """Readings from an instant query over ``READING_FAMILIES``; ``times``: each GPU's sample time by UUID."""
    gpus: dict[str, dict[str, Any]] = {}
    for s in series:
        labels = s.labels
        uuid, name = labels.get("uuid"), labels.get("__name__", "")
        if not uuid:
            continue
        fields = gpus.get(uuid)
        if fields is None:
            if not labels.get("gpu", "").isdigit():
                continue
            fields = gpus[uuid] = {
                "node": labels.get("node", ""),
                "gpu": int(labels["gpu"]),
                "uuid": uuid,
                "model": labels.get("model", "unknown"),
                "timestamp": times.get(uuid, s.samples[-1][0] if s.samples else now),
                "xid_errors": {},
            }
        value = s.value
        groups = _SPECS.get(name)
        if groups is not None:
            for keys, table in groups:
                for field, typer in table.get(tuple([labels.get(k) for k in keys]) if keys else (), ()):
                    fields[field] = value if typer is None else typer(value)
        elif name == INFO:
            fields["pci_bus_id"] = labels.get("pci_bus_id") or None
            fields["driver_version"] = labels.get("driver_version") or None
        elif name == UP:
            fields["up"] = value != 0
        elif name == THROTTLE:
            bit = THROTTLE_BITS.get(labels.get("reason", ""))
            if bit is not None:
                fields["throttle_reasons"] = fields.get("throttle_reasons", 0) | (bit if value else 0)
            if labels.get("source") in THROTTLE_SOURCES:
                fields["throttle_reasons_source"] = labels["source"]
        elif name == XIDS and labels.get("xid", "").isdigit():
            fields["xid_errors"][int(labels["xid"])] = round(value)
    return [GpuReading(**fields) for fields in gpus.values()]


def dcgm_readings(
    series: Sequence[PromSeries], times: Mapping[str, float], now: float, *, skip: Iterable[str] = ()
) -> tuple[list[GpuReading], list[GpuJob]]:
    """Readings and jobs from an instant query over ``DCGM_NAMES``, one dcgm page per node; GPUs in ``skip``
    (already read from gpulens families) are left out."""
    skipped = set(skip)
    by_node: dict[str, list[Sample]] = defaultdict(list)
    for s in series:
        uuid = s.labels.get("UUID")
        if uuid and uuid not in skipped:
            labels = {k: v for k, v in s.labels.items() if k != "__name__"}
            by_node[dcgm_node(s.labels)].append(Sample(s.labels.get("__name__", ""), labels, s.value))
    readings: list[GpuReading] = []
    jobs: list[GpuJob] = []
    for node, samples in by_node.items():
        parsed = dcgm_records(samples, node=node, timestamp=now)
        readings += [dataclasses.replace(r, timestamp=times.get(r.uuid, now)) for r in parsed.gpus]
        jobs += parsed.jobs
    return readings, jobs


def dcgm_jobs(series: Sequence[PromSeries], *, skip: Iterable[str] = ()) -> list[GpuJob]:
    """Jobs from dcgm-exporter's ``pod``/``namespace`` and ``hpc_job`` labels (a query grouped by them)."""
    skipped = set(skip)
    jobs: dict[tuple[str, str], GpuJob] = {}
    for s in series:
        uuid, index = s.labels.get("UUID", ""), s.labels.get("gpu", "")
        if uuid and uuid not in skipped and index.isdigit():
            for job_id in job_of(s.labels):
                jobs.setdefault((uuid, job_id), GpuJob(dcgm_node(s.labels), int(index), uuid, job_id))
    return list(jobs.values())


def job_of(labels: Mapping[str, str]) -> list[str]:
    """The job ids a series names: gpulens's ``job_id``, or dcgm-exporter's pod and hpc_job labels."""
    if labels.get("job_id"):
        return [labels["job_id"]]
    pod, namespace, hpc_job = (labels.get(k, "") for k in DCGM_JOB_LABELS)
    return ([f"{namespace}/{pod}" if namespace else pod] if pod else []) + ([hpc_job] if hpc_job else [])
