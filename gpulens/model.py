"""The record types that flow from a source to the exporter, the collector, storage and the UI.

Units are converted once, at the source: bytes, seconds, watts, degrees Celsius, hertz and 0-1 ratios.
A value that could not be read is ``None`` and its series is omitted downstream; never NaN or -1.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from gpulens.fabricmodel import HostReading, JobHostReading, NicReading

# Schema 2 added the ``nics`` and ``host`` sections; schema-1 documents (older exporters) are still read.
SNAPSHOT_SCHEMA: Final = 2
SNAPSHOT_SCHEMAS_READ: Final = (1, 2)

# Clock-event ("throttle") reason bits, as NVML defines them (nvmlClocksEventReason*).
THROTTLE_REASONS: Final[tuple[tuple[str, int], ...]] = (
    ("idle", 0x1),
    ("applications_clocks", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal", 0x20),
    ("hw_thermal", 0x40),
    ("hw_power_brake", 0x80),
    ("display_clocks", 0x100),
)
THROTTLE_MASK: Final = sum(bit for _, bit in THROTTLE_REASONS)


def throttle_reason_names(mask: int) -> list[str]:
    """The names of the reasons set in an NVML clock-event bitmask."""
    return [name for name, bit in THROTTLE_REASONS if mask & bit]


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU at one instant. Every optional field is ``None`` when the source cannot read it."""

    node: str
    gpu: int
    uuid: str
    model: str
    timestamp: float
    up: bool = True
    pci_bus_id: str | None = None
    driver_version: str | None = None
    mig_enabled: bool | None = None
    utilization_ratio: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    temperature_celsius: float | None = None
    memory_temperature_celsius: float | None = None
    slowdown_temperature_celsius: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules_total: float | None = None
    sm_clock_hertz: float | None = None
    memory_clock_hertz: float | None = None
    max_sm_clock_hertz: float | None = None
    max_memory_clock_hertz: float | None = None
    throttle_reasons: int | None = None
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    pcie_link_generation: int | None = None
    pcie_link_generation_max: int | None = None
    pcie_link_width: int | None = None
    pcie_link_width_max: int | None = None
    pcie_replays_total: int | None = None
    nvlink_tx_bytes_per_second: float | None = None
    nvlink_rx_bytes_per_second: float | None = None
    nvlink_links_active: int | None = None
    nvlink_crc_flit_errors_total: int | None = None
    nvlink_replay_errors_total: int | None = None
    nvlink_recovery_errors_total: int | None = None
    ecc_corrected_errors_total: int | None = None
    ecc_uncorrected_errors_total: int | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    sm_active_ratio: float | None = None
    tensor_active_ratio: float | None = None
    dram_active_ratio: float | None = None
    encoder_utilization_ratio: float | None = None
    decoder_utilization_ratio: float | None = None
    # XID code -> number of events seen since the source started (a counter per code).
    xid_errors: Mapping[int, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LinkReading:
    """One NVLink of one GPU."""

    node: str
    gpu: int
    uuid: str
    link: int
    active: bool
    tx_bytes_per_second: float | None = None
    rx_bytes_per_second: float | None = None
    remote_pci_bus_id: str | None = None


@dataclass(frozen=True, slots=True)
class ProcessReading:
    """A compute process on a GPU, with the job and user it belongs to when known."""

    node: str
    gpu: int
    uuid: str
    pid: int
    memory_used_bytes: int | None = None
    command: str | None = None
    user: str | None = None
    job_id: str | None = None


@dataclass(frozen=True, slots=True)
class GpuJob:
    """A job (Slurm job, Kubernetes pod, container, ...) that holds a GPU."""

    node: str
    gpu: int
    uuid: str
    job_id: str
    user: str | None = None
    mig_uuid: str | None = None  # the MIG instance (MigReading.mig_uuid) the job runs on, when known


@dataclass(frozen=True, slots=True)
class MigReading:
    """One MIG device (GPU instance) of a MIG-enabled GPU."""

    node: str
    gpu: int
    uuid: str
    mig_uuid: str
    gpu_instance_id: int
    compute_instance_id: int | None = None
    profile: str | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """Everything one source read from one node in one collection."""

    node: str
    timestamp: float
    source: str
    gpus: tuple[GpuReading, ...] = ()
    links: tuple[LinkReading, ...] = ()
    processes: tuple[ProcessReading, ...] = ()
    jobs: tuple[GpuJob, ...] = ()
    migs: tuple[MigReading, ...] = ()
    driver_version: str | None = None
    # The node's RDMA ports (InfiniBand / RoCE), its host CPUs and memory, and each job's share of the host;
    # empty / None where the source does not read them (dcgm-exporter pages, fabric reading off).
    nics: tuple[NicReading, ...] = ()
    host: HostReading | None = None
    job_hosts: tuple[JobHostReading, ...] = ()
    # Cumulative counts of the source's own failures by reason (e.g. "nvml_not_supported").
    errors: Mapping[str, int] = field(default_factory=dict)
    # GPU uuid -> quantity ("pcie", "nvlink", "profiling") -> where its values came from ("gpm", "sample",
    # "counters"); set by the NVML source, exported as gpulens_gpu_metric_source_info (not in the JSON document).
    metric_sources: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def replace(self, **changes: Any) -> NodeSnapshot:
        return dataclasses.replace(self, **changes)


class GpuSource(Protocol):
    """What every source (NVML, dcgm-exporter, simulator) implements."""

    def read(self) -> NodeSnapshot:
        """Read the node now. Raises ``SourceError`` only when nothing at all can be read."""
        ...

    def close(self) -> None: ...


class MultiNodeSource(Protocol):
    """A source that stands in for many nodes (the simulator's ``--all-nodes``)."""

    def node_names(self) -> list[str]: ...

    def read_node(self, node: str) -> NodeSnapshot: ...

    def close(self) -> None: ...


class SourceError(Exception):
    """A source failed as a whole (NVML missing, dcgm-exporter unreachable, ...)."""


class SnapshotFormatError(ValueError):
    """A snapshot document does not follow schema 1 or 2."""


# --- JSON (de)serialisation of a snapshot: the /api/v1/snapshot document ------------------------------------------


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}

# Links are many (18 per H100) and alike, so the document carries them as rows of these columns; a link's node and
# uuid are those of its GPU (the row's ``gpu`` index).
LINK_COLUMNS: Final = ("gpu", "link", "active", "tx_bytes_per_second", "rx_bytes_per_second", "remote_pci_bus_id")


def _names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def _record_to_json(record: Any) -> dict[str, Any]:
    """A record as a JSON object; ``None`` values are left out (absent and null both mean "not read")."""
    out: dict[str, Any] = {}
    for name in _names(type(record)):
        value = getattr(record, name)
        if value is None:
            continue
        if name == "xid_errors":
            if not value:
                continue
            value = {str(k): v for k, v in value.items()}
        elif isinstance(value, tuple):
            if not value:
                continue
            value = list(value)
        out[name] = value
    return out


def snapshot_to_json(snapshot: NodeSnapshot, health: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``/api/v1/snapshot`` document (schema 2). ``health`` is the exporter's own state.

    Schema 2 adds ``nics`` (one object per RDMA port, without its ``node``) and ``host`` (the node's CPUs and
    memory, with ``jobs``: each job's share of the host, without ``node``); ``host`` is null where not read."""
    doc: dict[str, Any] = {
        "schema": SNAPSHOT_SCHEMA,
        "node": snapshot.node,
        "time": snapshot.timestamp,
        "source": snapshot.source,
        "driver_version": snapshot.driver_version,
        "gpus": [_record_to_json(g) for g in snapshot.gpus],
        "link_columns": list(LINK_COLUMNS),
        "links": [[getattr(link, c) for c in LINK_COLUMNS] for link in snapshot.links],
        "processes": [_record_to_json(p) for p in snapshot.processes],
        "jobs": [_record_to_json(j) for j in snapshot.jobs],
        "migs": [_record_to_json(m) for m in snapshot.migs],
        "nics": [_without_node(_record_to_json(n)) for n in snapshot.nics],
        "host": _host_to_json(snapshot),
        "errors": dict(snapshot.errors),
    }
    if health is not None:
        doc["exporter"] = dict(health)
    return doc


def _without_node(obj: dict[str, Any]) -> dict[str, Any]:
    obj.pop("node", None)
    return obj


def _host_to_json(snapshot: NodeSnapshot) -> dict[str, Any] | None:
    if snapshot.host is None and not snapshot.job_hosts:
        return None
    host = _without_node(_record_to_json(snapshot.host)) if snapshot.host is not None else {}
    host["jobs"] = [_without_node(_record_to_json(j)) for j in snapshot.job_hosts]
    return host


_INT_TYPES: Final = ("int", "int | None")
_FLOAT_TYPES: Final = ("float", "float | None")
_BOOL_TYPES: Final = ("bool", "bool | None")
_STR_TYPES: Final = ("str", "str | None")
_TUPLE_TYPES: Final[dict[str, type]] = {"tuple[str, ...]": str, "tuple[int, ...]": int}


def _coerce(cls_name: str, name: str, annotation: str, value: Any) -> Any:
    optional = annotation.endswith("| None")
    if value is None:
        if optional:
            return None
        raise SnapshotFormatError(f"{cls_name}.{name}: null is not allowed")
    if annotation in _BOOL_TYPES:
        if not isinstance(value, bool):
            raise SnapshotFormatError(f"{cls_name}.{name}: expected a boolean, got {value!r:.40}")
        return value
    if annotation in _INT_TYPES:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise SnapshotFormatError(f"{cls_name}.{name}: expected an integer, got {value!r:.40}")
        if value != int(value):
            raise SnapshotFormatError(f"{cls_name}.{name}: expected an integer, got {value!r:.40}")
        return int(value)
    if annotation in _FLOAT_TYPES:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise SnapshotFormatError(f"{cls_name}.{name}: expected a finite number, got {value!r:.40}")
        return float(value)
    if annotation in _STR_TYPES:
        if not isinstance(value, str):
            raise SnapshotFormatError(f"{cls_name}.{name}: expected a string, got {value!r:.40}")
        return value
    if annotation in _TUPLE_TYPES:
        item_type = _TUPLE_TYPES[annotation]
        if not isinstance(value, list) or not all(isinstance(v, item_type) and not isinstance(v, bool) for v in value):
            raise SnapshotFormatError(f"{cls_name}.{name}: expected an array of {item_type.__name__}")
        return tuple(value)
    if name == "xid_errors":
        if not isinstance(value, dict):
            raise SnapshotFormatError(f"{cls_name}.xid_errors: expected an object")
        try:
            return {int(k): int(v) for k, v in value.items()}
        except (TypeError, ValueError) as exc:
            raise SnapshotFormatError(f"{cls_name}.xid_errors: {exc}") from None
    raise SnapshotFormatError(f"{cls_name}.{name}: unsupported field type {annotation}")  # pragma: no cover


# Keys that older exporters wrote, by record type: old key -> the field's name now.
_OLD_KEYS: Final[dict[str, dict[str, str]]] = {"ProcessReading": {"used_memory_bytes": "memory_used_bytes"}}


def _record_from_json(cls: Any, data: Any) -> Any:
    if not isinstance(data, dict):
        raise SnapshotFormatError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
    for old, new in _OLD_KEYS.get(cls.__name__, {}).items():
        if old in data and new not in data:
            data = {**data, new: data[old]}
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        annotation = str(f.type)
        if f.name not in data:
            has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            if has_default:
                continue
            raise SnapshotFormatError(f"{cls.__name__}: missing field {f.name!r}")
        if annotation.startswith("Mapping"):
            annotation = "Mapping"
        kwargs[f.name] = _coerce(cls.__name__, f.name, annotation, data[f.name])
    return cls(**kwargs)


def _records(cls: Any, doc: Mapping[str, Any], key: str, node: str | None = None) -> tuple[Any, ...]:
    """The records of section ``key``; ``node`` fills the records' node where the document leaves it out."""
    items = doc.get(key, [])
    if items is None:
        return ()
    if not isinstance(items, list):
        raise SnapshotFormatError(f"{key}: expected an array")
    if node is not None:
        items = [{**item, "node": node} if isinstance(item, dict) else item for item in items]
    return tuple(_record_from_json(cls, item) for item in items)


def _host(doc: Mapping[str, Any], node: str) -> tuple[HostReading | None, tuple[JobHostReading, ...]]:
    host = doc.get("host")
    if host is None:
        return None, ()
    if not isinstance(host, dict):
        raise SnapshotFormatError("host: expected an object")
    jobs = _records(JobHostReading, host, "jobs", node)
    fields = {k: v for k, v in host.items() if k != "jobs"}
    reading = _record_from_json(HostReading, {**fields, "node": node}) if fields else None
    return reading, jobs


def _links(doc: Mapping[str, Any], node: str) -> tuple[LinkReading, ...]:
    rows = doc.get("links", [])
    if not isinstance(rows, list):
        raise SnapshotFormatError("links: expected an array")
    if rows and doc.get("link_columns") != list(LINK_COLUMNS):
        raise SnapshotFormatError(f"link_columns: expected {list(LINK_COLUMNS)}")
    uuids: dict[int, str] = {}
    for g in doc.get("gpus", []):
        if isinstance(g, dict) and isinstance(g.get("gpu"), int) and isinstance(g.get("uuid"), str):
            uuids[g["gpu"]] = g["uuid"]
    links = []
    for row in rows:
        if not isinstance(row, list) or len(row) != len(LINK_COLUMNS):
            raise SnapshotFormatError(f"links: expected rows of {len(LINK_COLUMNS)} values")
        values = dict(zip(LINK_COLUMNS, row, strict=True))
        gpu = _coerce("LinkReading", "gpu", "int", values["gpu"])
        uuid = uuids.get(gpu)
        if uuid is None:
            raise SnapshotFormatError(f"links: GPU {gpu} is not among the snapshot's GPUs")
        links.append(
            LinkReading(
                node=node,
                gpu=gpu,
                uuid=uuid,
                link=_coerce("LinkReading", "link", "int", values["link"]),
                active=_coerce("LinkReading", "active", "bool", values["active"]),
                tx_bytes_per_second=_coerce("LinkReading", "tx", "float | None", values["tx_bytes_per_second"]),
                rx_bytes_per_second=_coerce("LinkReading", "rx", "float | None", values["rx_bytes_per_second"]),
                remote_pci_bus_id=_coerce("LinkReading", "remote", "str | None", values["remote_pci_bus_id"]),
            )
        )
    return tuple(links)


def snapshot_from_json(doc: Any) -> NodeSnapshot:
    """Parse and type-check a schema-1 or schema-2 snapshot document. Raises ``SnapshotFormatError``."""
    if not isinstance(doc, dict):
        raise SnapshotFormatError("snapshot: expected a JSON object")
    if doc.get("schema") not in SNAPSHOT_SCHEMAS_READ:
        raise SnapshotFormatError(f"snapshot: unsupported schema {doc.get('schema')!r:.20}")
    node = _coerce("snapshot", "node", "str", doc.get("node"))
    timestamp = _coerce("snapshot", "time", "float", doc.get("time"))
    errors = doc.get("errors", {})
    if not isinstance(errors, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in errors.items()
    ):
        raise SnapshotFormatError("snapshot.errors: expected an object of integer counts")
    host, job_hosts = _host(doc, node)
    return NodeSnapshot(
        node=node,
        timestamp=timestamp,
        source=_coerce("snapshot", "source", "str", doc.get("source", "unknown")),
        driver_version=_coerce("snapshot", "driver_version", "str | None", doc.get("driver_version")),
        gpus=_records(GpuReading, doc, "gpus"),
        links=_links(doc, node),
        processes=_records(ProcessReading, doc, "processes"),
        jobs=_records(GpuJob, doc, "jobs"),
        migs=_records(MigReading, doc, "migs"),
        nics=_records(NicReading, doc, "nics", node),
        host=host,
        job_hosts=job_hosts,
        errors=dict(errors),
    )


class NodeUnavailableError(SourceError):
    """The node's exporter cannot answer at all (the simulator's ``exporter_down`` fault); served as HTTP 503."""


@dataclass(frozen=True, slots=True)
class TargetHealth:
    """The outcome of one scrape of one target by the collector."""

    target: str  # the target's name (its base URL unless configured otherwise)
    url: str  # the URL scraped, with any credentials redacted
    kind: str  # "gpulens" | "dcgm"
    timestamp: float
    up: bool
    node: str | None = None
    scrape_duration_seconds: float | None = None
    samples: int = 0  # GPU readings accepted from this scrape
    rejected: int = 0  # readings or lines rejected from this scrape
    last_error: str | None = None
