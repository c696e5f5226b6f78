"""The SQL store as a ``StoreReader`` (``gpulens.storage.reading``): ``SqlReader`` over a ``Database``, and the
reader of one snapshot that ``SqlReader.snapshot()`` hands out.

Each read is one of the SQL read modules (``latest``, ``timeseries``, ``jobstats``, ``inventory``, ``fabric``,
``slurmtables``, ``jobsummary``, ``ncclstore``). A snapshot reader reads through one open session: SQLite one WAL
snapshot (a deferred ``BEGIN``), PostgreSQL one ``REPEATABLE READ`` transaction, so a page that makes six reads sees
one moment of a store the collector writes to every 10 s; it also remembers the current jobs and the processes, each
read when first asked for.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

from gpulens.fabricmodel import HostReading, JobHostReading, NicReading
from gpulens.model import GpuJob, GpuReading, JobInfo, ProcessReading, TargetHealth
from gpulens.ncclinspect import BandwidthPoint, InspectorView
from gpulens.ncclmodel import NcclView
from gpulens.nodehardware import NodeHardware
from gpulens.nodehealth import NodeHealth
from gpulens.settings import Prices
from gpulens.storage import (
    fabric,
    hardwarestore,
    idletrend,
    inspectorstore,
    inventory,
    jobstats,
    jobsummary,
    latest,
    ncclstore,
    portproblems,
    remediationstore,
    slurmtables,
    timeseries,
    usagereport,
)
from gpulens.storage.db import Database
from gpulens.storage.reading import NotAvailableOnBackend, StoreReader
from gpulens.storage.records import (
    GpuInfo,
    IdlePoint,
    JobAccount,
    JobSummary,
    LinkOutage,
    LinkSummary,
    NodeTotals,
    SeriesData,
    StuckRank,
    UsageRow,
)


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
        newest_rates: bool = False,
    ) -> list[NicReading]:
        return fabric.latest_nics(self.db, node=node, max_age_s=max_age_s, fields=fields, nodes=nodes)  # newest

    def history_start(self) -> float | None:
        return inventory.history_start(self.db)

    def nic_counts(self) -> dict[str, tuple[int, int]]:
        return fabric.nic_counts(self.db)

    def nic_problems(self, start: float, end: float) -> dict[str, tuple[str, ...]]:
        return portproblems.nic_problems(self, start, end)

    def latest_hosts(self, *, node: str | None = None) -> list[HostReading]:
        return fabric.latest_hosts(self.db, node=node)

    def latest_job_hosts(self, *, job_id: str | None = None) -> list[JobHostReading]:
        return fabric.latest_job_hosts(self.db, job_id=job_id)

    def latest_hardware(self, nodes: Sequence[str] | None = None) -> dict[str, tuple[NodeHardware, str | None]]:
        return hardwarestore.latest(self.db, nodes)

    def node_health(self, nodes: Sequence[str] | None = None) -> dict[str, NodeHealth]:
        return hardwarestore.latest_health(self.db, nodes)

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

    def job_info(self, job_ids: Sequence[str]) -> dict[str, JobInfo]:
        return slurmtables.read_job_info(self.db, job_ids)

    def job_account(self, job_id: str) -> JobAccount | None:
        # one stored row: computing a summary reads every raw sample of the job's life (``gpulens job-summary``)
        return jobsummary.stored(self.db, job_id) if jobsummary.has_table(self.db) else None

    def usage(self, by: str, start: float, end: float, prices: Prices) -> list[UsageRow]:
        return usagereport.usage(self.db, by, start, end, prices)

    def idle_trend(self, by: str, start: float, end: float, step_s: float, prices: Prices) -> list[IdlePoint]:
        return idletrend.idle_trend(self.db, by, start, end, step_s, prices)

    def stuck_ranks(self, job_id: str, start: float, end: float) -> list[StuckRank]:
        return ncclstore.stuck_ranks(self.db, job_id, start, end)

    def latest_nccl(self, *, max_age_s: float) -> dict[str, NcclView]:
        return ncclstore.latest_views(self.db, self.clock.now() - max_age_s)

    def latest_inspector(self, *, max_age_s: float) -> dict[str, InspectorView]:
        return inspectorstore.latest_views(self.db, self.clock.now() - max_age_s)

    def job_bandwidth(self, job_id: str, start: float, end: float) -> list[BandwidthPoint]:
        return inspectorstore.job_bandwidth(self.db, job_id, start, end)

    def hung_nodes(self, *, max_age_s: float) -> dict[str, float]:
        raise NotAvailableOnBackend("hung GPU drivers", "SQL", "the collector's own engine judges them from the round")

    def drain_actions(self, limit: int = 50) -> list[dict[str, Any]]:
        return slurmtables.recent_drain_actions(self.db, limit)

    def remediation_state(self) -> dict[str, Any]:
        return remediationstore.remediation_state(self.db)

    @contextmanager
    def snapshot(self) -> Iterator[StoreReader]:
        with self.db.session() as session:
            if self.db.dialect == "postgresql":  # one snapshot for every statement, not one per statement
                session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
            yield SnapshotReader(self.db, session)

    def close(self) -> None:
        self.db.close()


class _OneSession:
    """A ``Database`` stand-in whose ``session()`` is always the same open session (everything else delegates)."""

    def __init__(self, db: Database, session: Any) -> None:
        self._db = db
        self._session = session

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    @contextmanager
    def session(self) -> Iterator[Any]:
        yield self._session


class SnapshotReader(SqlReader):
    """``SqlReader`` over one open session; the current jobs and the processes are each read once, when asked for."""

    def __init__(self, db: Database, session: Any) -> None:
        super().__init__(cast("Database", _OneSession(db, session)))
        self._jobs: dict[str | None, list[GpuJob]] = {}
        self._processes: dict[str | None, list[ProcessReading]] = {}

    def current_jobs(self, *, node: str | None = None) -> list[GpuJob]:
        jobs = self._jobs.get(node)
        if jobs is None:
            jobs = self._jobs[node] = latest.current_jobs(self.db, node=node)
        return list(jobs)

    def current_processes(self, *, node: str | None = None) -> list[ProcessReading]:
        processes = self._processes.get(node)
        if processes is None:
            processes = self._processes[node] = latest.current_processes(self.db, node=node)
        return list(processes)

    @contextmanager
    def snapshot(self) -> Iterator[StoreReader]:
        yield self  # already one snapshot

    def close(self) -> None:
        """The session belongs to ``SqlReader.snapshot``; closing a snapshot reader closes nothing."""


def reader_of(store: Database | StoreReader) -> StoreReader:
    """``store`` as a reader: a ``Database`` is wrapped in ``SqlReader``."""
    return SqlReader(store) if isinstance(store, Database) else store
