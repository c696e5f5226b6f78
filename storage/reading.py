"""The read interface of a store: what the dashboard, ``gpulens query`` and the alert engine read, whatever holds it.

``StoreReader`` is the protocol; ``SqlReader`` serves it from the SQL store (``gpulens.storage.latest``, ``timeseries``,
``jobstats``, ``inventory``) and ``storage.prometheus.PromReader`` from a Prometheus-compatible query API. A store
that cannot give something raises ``NotAvailableOnBackendError``, which the callers show as "not available on this
backend": never as zero or as an empty success.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gpulens.clock import Clock
from gpulens.fabricmodel import HostReading, JobHostReading, NicReading
from gpulens.model import GpuJob, GpuReading, ProcessReading, TargetHealth
from gpulens.nodehardware import NodeHardware
from gpulens.storage import fabric, hardwarestore, inventory, jobstats, latest, portproblems, timeseries
from gpulens.storage.db import Database
from gpulens.storage.inventory import GpuInfo, LinkOutage
from gpulens.storage.jobstats import JobSummary
from gpulens.storage.latest import LinkSummary, NodeTotals
from gpulens.storage.timeseries import SeriesData

NOT_AVAILABLE = "not available on this backend"


class NotAvailableOnBackendError(Exception):
    """The store cannot give ``what`` (the Prometheus backend has no process table, for example)."""

    def __init__(self, what: str, backend: str) -> None:
        super().__init__(f"{what}: {NOT_AVAILABLE} ({backend})")
        self.what = what
        self.backend = backend


class TooManySeriesError(ValueError):
    """A query would return more series than the reader's limit; the message says how to narrow it."""


class StoreReader(Protocol):
    """Read access to the monitoring history. Records are the core's; units are SI."""

    url_redacted: str  # the store's URL without credentials, for pages and logs
    clock: Clock
    backend: str  # "sqlite" | "postgresql" | "prometheus"

    def scrub(self, text: str) -> str:
        """``text`` with the store's secrets replaced by ``***``."""
        ...

    def latest_readings(
        self,
        *,
        node: str | None = None,
        uuids: Sequence[str] | None = None,
        max_age_s: float | None = None,
        fields: Sequence[str] | None = None,
    ) -> list[GpuReading]:
        """The newest reading of every GPU (of ``node`` / ``uuids`` only, if given), by node and index.

        ``fields``: the reading fields the caller needs (identity, ``up`` and ``timestamp`` always come); a store
        may leave the others ``None`` to read less (Prometheus does: fewer series per GPU)."""
        ...

    def current_jobs(self, *, node: str | None = None) -> list[GpuJob]:
        """The jobs holding each GPU (of ``node`` only, if given) now."""
        ...

    def link_summary(self, top: int) -> LinkSummary | None:
        """Every GPU's link loads and the GPUs to read whole (degraded links; the ``top`` by link errors), where the
        store keeps the loads fresh; ``None`` where it does not (the caller reads every GPU's link fields)."""
        ...

    def node_totals(self) -> list[NodeTotals] | None:
        """Every node's GPUs now, counted and summed, where the store keeps such sums fresh; ``None`` where it does
        not (the caller sums the readings)."""
        ...

    def current_processes(self, *, node: str | None = None) -> list[ProcessReading]:
        """The processes of each GPU's latest reading (of ``node`` only, if given); raises
        ``NotAvailableOnBackendError`` where none are kept."""
        ...

    def series(
        self, uuids: Sequence[str], fields: Sequence[str], start: float, end: float, max_points: int = 1000
    ) -> dict[str, SeriesData]:
        """Time series of ``fields`` for ``uuids`` over [start, end], at most ``max_points`` per GPU."""
        ...

    def jobs(self, start: float, end: float, *, job_id: str | None = None) -> list[JobSummary]:
        """Every job (or only ``job_id``) that held a GPU during [start, end], most GPU-hours first."""
        ...

    def gpu_info(self, *, uuids: Sequence[str] | None = None) -> list[GpuInfo]:
        """Static info of every GPU known (of ``uuids`` only, if given), by node and index."""
        ...

    def link_outages(self, start: float, end: float) -> list[LinkOutage]:
        """NVLinks reported inactive at some time in [start, end]."""
        ...

    def target_health(self) -> list[TargetHealth]:
        """The latest health of every scrape target, by name."""
        ...

    def latest_nics(
        self,
        *,
        node: str | None = None,
        max_age_s: float | None = None,
        fields: Sequence[str] | None = None,
        nodes: Sequence[str] | None = None,
    ) -> list[NicReading]:
        """The newest reading of every RDMA port (of ``node`` / ``nodes`` / newer than ``max_age_s`` only, if
        given), by node, device and port.

        ``fields``: the ``NicReading`` fields the caller needs (identity, link layer, placement and ``up`` always
        come); a store may leave the others ``None`` to read less (Prometheus does: one query fewer per field left
        out, over every port). A name that is not a ``NicReading`` field raises ``ValueError``."""
        ...

    def history_start(self) -> float | None:
        """When the stored history begins (the first GPU seen); None when unknown or nothing is stored."""
        ...

    def nic_counts(self) -> dict[str, tuple[int, int]]:
        """Per node, its RDMA ports now: (up, all) (counted in the store: one short answer per node, where
        ``latest_nics`` reads every port's fields)."""
        ...

    def nic_problems(self, start: float, end: float) -> dict[str, tuple[str, ...]]:
        """Every RDMA port now, by nic id, with its problems (``storage.portproblems``: of down, degraded, errors,
        saturated, in that order; errors: its error counters rose in [start, end]), told in the store where it
        can: the ports with a problem, not every port's fields (a page ranks the ports by these, then reads whole
        only the ones it shows)."""
        ...

    def latest_hosts(self, *, node: str | None = None) -> list[HostReading]:
        """The newest reading of every node's CPUs and memory (of ``node`` only, if given), by node."""
        ...

    def latest_hardware(self, nodes: Sequence[str] | None = None) -> dict[str, tuple[NodeHardware, str | None]]:
        """Each node's newest hardware and its driver version (``storage.hardwarestore``)."""
        ...

    def latest_job_hosts(self, *, job_id: str | None = None) -> list[JobHostReading]:
        """Each running job's share of each of its nodes (of ``job_id`` only, if given), by job and node."""
        ...

    def nic_series(
        self, nic_ids: Sequence[str], fields: Sequence[str], start: float, end: float, max_points: int = 1000
    ) -> dict[str, SeriesData]:
        """Series of port ``fields`` keyed by nic id (``node/device/port``, also in ``SeriesData.uuid``): rates and
        ``up`` as means, error counters (``*_total``) as rates per second."""
        ...

    def host_series(
        self, nodes: Sequence[str], fields: Sequence[str], start: float, end: float, max_points: int = 1000
    ) -> dict[str, SeriesData]:
        """Series of host ``fields`` (cpu_busy_ratio, cpu_iowait_ratio, memory_used/available_bytes) by node."""
        ...

    def job_host_series(
        self, job_id: str, fields: Sequence[str], start: float, end: float, max_points: int = 1000
    ) -> dict[str, SeriesData]:
        """Series of the job's ``fields`` (cpu_used_cores, memory_used_bytes) on each of its nodes, by node."""
        ...

    def close(self) -> None: ...


class SqlReader:
    """``StoreReader`` over the SQL store."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.url_redacted = db.url_redacted
        self.clock = db.clock
        self.backend = db.dialect

    def scrub(self, text: str) -> str:
        return self.db.scrub(text)

    def latest_readings(
        self,
        *,
        node: str | None = None,
        uuids: Sequence[str] | None = None,
        max_age_s: float | None = None,
        fields: Sequence[str] | None = None,
    ) -> list[GpuReading]:
        return latest.latest_readings(self.db, max_age_s=max_age_s, node=node, uuids=uuids, fields=fields)

    def current_jobs(self, *, node: str | None = None) -> list[GpuJob]:
        return latest.current_jobs(self.db, node=node)

    def node_totals(self) -> list[NodeTotals] | None:
        return None  # one indexed read gives every GPU's newest row: the page sums them

    def link_summary(self, top: int) -> LinkSummary | None:
        return None  # likewise

    def current_processes(self, *, node: str | None = None) -> list[ProcessReading]:
        return latest.current_processes(self.db, node=node)

    def series(
        self, uuids: Sequence[str], fields: Sequence[str], start: float, end: float, max_points: int = 1000
    ) -> dict[str, SeriesData]:
        return timeseries.series(self.db, uuids, fields, start, end, max_points)

    def jobs(self, start: float, end: float, *, job_id: str | None = None) -> list[JobSummary]:
        return jobstats.jobs(self.db, start, end, job_id=job_id)

    def gpu_info(self, *, uuids: Sequence[str] | None = None) -> list[GpuInfo]:
        return inventory.gpu_info(self.db, uuids=uuids)

    def link_outages(self, start: float, end: float) -> list[LinkOutage]:
        return inventory.link_outages(self.db, start, end)

    def target_health(self) -> list[TargetHealth]:
        return inventory.target_health(self.db)

    def latest_nics(
        self,
        *,
        node: str | None = None,
        max_age_s: float | None = None,
        fields: Sequence[str] | None = None,
        nodes: Sequence[str] | None = None,
    ) -> list[NicReading]:
        return fabric.latest_nics(self.db, node=node, max_age_s=max_age_s, fields=fields, nodes=nodes)

    def history_start(self) -> float | None:
        return inventory.history_start(self.db)

    def nic_counts(self) -> dict[str, tuple[int, int]]:
        return fabric.nic_counts(self.db)

    def nic_problems(self, start: float, end: float) -> dict[str, tuple[str, ...]]:
        return portproblems.nic_problems(self, start, end)

    def latest_hosts(self, *, node: str | None = None) -> list[HostReading]:
        return fabric.latest_hosts(self.db, node=node)

    def latest_hardware(self, nodes: Sequence[str] | None = None) -> dict[str, tuple[NodeHardware, str | None]]:
        return hardwarestore.latest(self.db, nodes)

    def latest_job_hosts(self, *, job_id: str | None = None) -> list[JobHostReading]:
        return fabric.latest_job_hosts(self.db, job_id=job_id)

    def nic_series(
        self, nic_ids: Sequence[str], fields: Sequence[str], start: float, end: float, max_points: int = 1000
    ) -> dict[str, SeriesData]:
        return fabric.nic_series(self.db, nic_ids, fields, start, end, max_points)

    def host_series(
        self, nodes: Sequence[str], fields: Sequence[str], start: float, end: float, max_points: int = 1000
    ) -> dict[str, SeriesData]:
        return fabric.host_series(self.db, nodes, fields, start, end, max_points)

    def job_host_series(
        self, job_id: str, fields: Sequence[str], start: float, end: float, max_points: int = 1000
    ) -> dict[str, SeriesData]:
        return fabric.job_host_series(self.db, job_id, fields, start, end, max_points)

    def close(self) -> None:
        self.db.close()


def reader_of(store: Database | StoreReader) -> StoreReader:
    """``store`` as a reader: a ``Database`` is wrapped in ``SqlReader``."""
    return SqlReader(store) if isinstance(store, Database) else store
