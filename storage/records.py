"""The records and field catalogue every store reader returns and checks, whatever holds the data.

The SQL reader (``gpulens.storage.sqlreader``) and the Prometheus reader (``gpulens.storage.prometheus``) both answer
in these records, in SI units, and both check the fields a caller names against ``READABLE_FIELDS``. This module
imports neither SQLAlchemy nor HTTP code: the Prometheus reader needs no SQL library, and the SQL schema derives its
sample columns from the same catalogue (``storage.schema``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final, Literal

from gpulens.fabricmodel import NicReading
from gpulens.metriccatalogue import GPU_FIELDS
from gpulens.ratios import LinkLoad

JOB_POINTS: Final = 24  # a job summary reads about this many buckets (or steps) over its range
IDLE_UTILIZATION: Final = 0.05  # a GPU below this utilization is idle
# the link error counters (their sum ranks GPUs by link errors)
LINK_ERROR_FIELDS: Final = (
    "pcie_replays_total",
    "nvlink_crc_flit_errors_total",
    "nvlink_replay_errors_total",
    "nvlink_recovery_errors_total",
)

FieldKind = Literal["gauge", "counter", "bitmask"]


@dataclass(frozen=True, slots=True)
class ReadableField:
    """A ``GpuReading`` field a store can give as a series: gauges as mean, min and max per bucket, counters as a rate
    per second (under the same name), bitmasks as the OR of the bucket."""

    name: str
    kind: FieldKind


def _readable_fields() -> tuple[ReadableField, ...]:
    kinds: dict[str, FieldKind] = {"gauge": "gauge", "counter": "counter"}
    return (
        ReadableField("up", "gauge"),
        *(ReadableField(spec.field, kinds[spec.type]) for spec in GPU_FIELDS),
        ReadableField("throttle_reasons", "bitmask"),
        ReadableField("throttle_reasons_source", "bitmask"),
        ReadableField("xid_total", "counter"),  # the sum of the per-code XID counters
    )


# Every field ``series`` reads, in the SQL store's column order (``storage.schema.SAMPLE_FIELDS`` is built from it).
READABLE_FIELDS: Final[tuple[ReadableField, ...]] = _readable_fields()
FIELD_KINDS: Final[Mapping[str, FieldKind]] = {f.name: f.kind for f in READABLE_FIELDS}
NIC_READING_FIELDS: Final = tuple(f.name for f in dataclasses.fields(NicReading))


def check_fields(fields: Sequence[str]) -> None:
    """Raise ``ValueError`` for a name in ``fields`` that is not in ``READABLE_FIELDS``."""
    unknown = [f for f in fields if f not in FIELD_KINDS]
    if unknown:
        raise ValueError(f"unknown fields {', '.join(unknown)}; known: {', '.join(FIELD_KINDS)}")


def check_nic_fields(fields: Sequence[str] | None) -> None:
    """Raise ``ValueError`` for a name in ``fields`` that is not a ``NicReading`` field."""
    unknown = [f for f in fields or () if f not in NIC_READING_FIELDS]
    if unknown:
        raise ValueError(f"unknown port fields {', '.join(unknown)}; known: {', '.join(NIC_READING_FIELDS)}")


@dataclass(frozen=True, slots=True)
class GpuInfo:
    node: str
    gpu: int
    uuid: str
    model: str
    pci_bus_id: str | None
    driver_version: str | None
    mig_enabled: bool | None
    first_seen: float
    last_seen: float


@dataclass(frozen=True, slots=True)
class LinkOutage:
    """An NVLink reported inactive from ``since`` to ``until`` (None while it still is)."""

    node: str
    gpu: int
    uuid: str
    link: int
    since: float
    until: float | None
    remote_pci_bus_id: str | None


@dataclass(frozen=True, slots=True)
class JobSummary:
    """A job over a time range: GPU-hours and utilization within the range; first and last seen overall."""

    job_id: str
    user: str | None
    gpus: tuple[str, ...]  # GPU UUIDs
    nodes: tuple[str, ...]
    first_seen: float
    last_seen: float
    gpu_hours: float
    utilization_ratio_mean: float | None
    utilization_ratio_stddev: float | None  # over every sample of every GPU; from rollups, over bucket means
    memory_used_bytes_mean: float | None
    memory_used_bytes_max: int | None
    resolution: str


@dataclass(frozen=True, slots=True)
class NodeTotals:
    """One node's GPUs now, counted and summed where a store keeps such sums (Prometheus's recording rules), so that
    a page showing the whole cluster's totals need not read every GPU's fields. Over the node's GPUs up."""

    node: str
    timestamp: float  # when they were summed
    up: int
    busy: int
    idle: int  # busy + idle: the GPUs up that report their utilization
    allocated_idle: int
    utilization_ratio_sum: float  # over busy + idle
    memory_used_bytes: float
    memory_total_bytes: float
    power_watts: float
    power_limit_watts: float


@dataclass(frozen=True, slots=True)
class LinkSummary:
    """The interconnect page's view of every GPU where a store keeps it (Prometheus's recording rules): every GPU's
    link loads as of ``timestamp``, and the GPUs the page must read whole now, a superset of those whose links are
    degraded and of the ``top`` with the most link errors counted; and each node's newest GPU sample (the page's node
    list and stale nodes, without a read of every GPU)."""

    timestamp: float
    loads: list[LinkLoad]
    named: list[str]  # uuids
    best_links: dict[str, int]  # model -> the most NVLinks active on a GPU of it
    seen: dict[str, float]  # node -> the time of its newest GPU sample, every node with a GPU in the store now


@dataclass(frozen=True, slots=True)
class SeriesData:
    """One GPU's series: per bucket, the mean (gauges), rate per second (counters) or OR (bitmasks) of each field."""

    uuid: str
    resolution: str  # the tier most of the range came from: "raw" | "1m" | "1h"
    step_seconds: float
    timestamps: tuple[float, ...]  # bucket start times; buckets without data are left out
    values: Mapping[str, tuple[float | None, ...]]
    minimum: Mapping[str, tuple[float | None, ...]]  # for counters and bitmasks, the same as values
    maximum: Mapping[str, tuple[float | None, ...]]


@dataclass(frozen=True, slots=True)
class StuckRank:
    """One rank that stood out in one round, as the job page draws it."""

    ts: float
    node: str
    comm: str
    rank: int
    gpu: int | None
    gpu_uuid: str | None
    pid: int | None
    state: str
    lag: int | None
    count: int | None
    top_count: int | None
    collective: str | None


@dataclass(frozen=True, slots=True)
class JobAccount:
    """What a job held and used, and what it cost. ``None``: not known (no such samples)."""

    job_id: str
    user: str | None
    start: float
    end: float
    ended: bool
    gpus: int
    nodes: tuple[str, ...]
    gpu_hours: float
    energy_kwh: float | None
    energy_from: str | None  # "counter", "power" or "counter+power"
    utilization_mean: float | None
    memory_peak_bytes: int | None
    idle_ratio: float | None
    stall_seconds: float
    cost: float
    currency: str
    carbon_gco2e: float | None

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["nodes"] = list(self.nodes)
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> JobAccount:
        return cls(**{**doc, "nodes": tuple(doc["nodes"])})


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One user's (account's, partition's) jobs in a report's period (``storage.usagereport``)."""

    group: str
    jobs: int
    gpu_hours: float
    used_gpu_hours: float | None  # None: no job of the group has samples to judge idleness by
    idle_ratio: float | None
    energy_kwh: float | None
    cost: float
    currency: str
    hung_jobs: int
    hung_seconds: float


@dataclass(frozen=True, slots=True)
class IdlePoint:
    """One group's samples of allocated GPUs in one time bucket, and how many were idle (``storage.idletrend``)."""

    start: float  # the bucket's start
    group: str
    samples: int
    idle_samples: int
