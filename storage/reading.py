"""The read interface of a store: what the dashboard, ``gpulens query`` and the alert engine read, whatever holds it.

``StoreReader`` is the protocol; ``storage.sqlreader.SqlReader`` serves it from the SQL store and
``storage.prometheus.PromReader`` from a Prometheus-compatible query API. A read a store cannot serve raises
``NotAvailableOnBackend``, naming the read and the store ("NCCL communicator history: not available on
Prometheus"): callers catch that one exception and say so, never asking which class the reader is, and never show
it as zero or as an empty success. Like the records (``storage.records``), this module imports no SQL library: the
Prometheus reader imports it without SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from gpulens.clock import Clock
from gpulens.fabricmodel import HostReading, JobHostReading, NicReading
from gpulens.model import GpuJob, GpuReading, JobInfo, ProcessReading, TargetHealth
from gpulens.ncclinspect import BandwidthPoint, InspectorView
from gpulens.ncclmodel import NcclView
from gpulens.nodehardware import NodeHardware
from gpulens.nodehealth import NodeHealth
from gpulens.settings import Prices
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

NOT_AVAILABLE = "not available on this backend"


class DatabaseUnavailableError(Exception):
    """The database cannot be reached now (refused, down, locked too long): the caller spools and retries."""


class NotAvailableOnBackend(Exception):  # noqa: N818  (the name is a contract: one error for every read a store lacks)
    """The store ``backend`` (its name as shown: "Prometheus") cannot serve the read ``what``; ``why``, if given, says
    why ("it holds no gpulens exporter series")."""

    def __init__(self, what: str, backend: str, why: str = "") -> None:
        super().__init__(f"{what}: not available on {backend}" + (f" ({why})" if why else ""))
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
        ``NotAvailableOnBackend`` where none are kept."""
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
        newest_rates: bool = False,
    ) -> list[NicReading]:
        """The newest reading of every RDMA port (of ``node`` / ``nodes`` / newer than ``max_age_s`` only, if
        given), by node, device and port. ``newest_rates``: rates between the port's last two readings, as the
        exporter computes them between collections (the alert engine's); else a store may average them over a
        window it chooses (Prometheus: four scrapes, as its recording rules do).

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

    def node_health(self, nodes: Sequence[str] | None = None) -> dict[str, NodeHealth]:
        """Each node's health (``gpulens.nodehealth``; of ``nodes`` only, if given): over SQL as its agent's last
        hardware row judged it, with findings; over Prometheus its ``gpulens_node_health{state}`` and action."""
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

    def job_info(self, job_ids: Sequence[str]) -> dict[str, JobInfo]:
        """What the scheduler says of each job (name, account, partition, array), for the ids it knows."""
        ...

    def job_account(self, job_id: str) -> JobAccount | None:
        """The job's accounting summary as the collector stored it (``storage.jobsummary``); None where none is."""
        ...

    def usage(self, by: str, start: float, end: float, prices: Prices) -> list[UsageRow]:
        """GPU usage per user, account or partition (``by``) of the jobs that held a GPU in [start, end]: the report
        of ``storage.usagereport``; ``NotAvailableOnBackend`` where the store keeps no job summaries."""
        ...

    def idle_trend(self, by: str, start: float, end: float, step_s: float, prices: Prices) -> list[IdlePoint]:
        """The idle share of the allocated GPUs' samples per bucket of ``step_s`` and per group
        (``storage.idletrend``); ``NotAvailableOnBackend`` where the store cannot say it."""
        ...

    def stuck_ranks(self, job_id: str, start: float, end: float) -> list[StuckRank]:
        """The job's NCCL ranks that stood out (behind, unreachable) in each round of [start, end], oldest first."""
        ...

    def latest_nccl(self, *, max_age_s: float) -> dict[str, NcclView]:
        """Each node's newest NCCL RAS view no older than ``max_age_s``: the communicators out of step and the ranks
        behind or unreachable in it (what the stall rules weigh), by node."""
        ...

    def latest_inspector(self, *, max_age_s: float) -> dict[str, InspectorView]:
        """Each node's newest NCCL Inspector view no older than ``max_age_s`` (bus bandwidth per job, communicator,
        collective and size class), by node."""
        ...

    def job_bandwidth(self, job_id: str, start: float, end: float) -> list[BandwidthPoint]:
        """The bus bandwidth NCCL's Inspector measured for the job's collectives in [start, end], oldest first."""
        ...

    def hung_nodes(self, *, max_age_s: float) -> dict[str, float]:
        """Each node whose exporter says now (no older than ``max_age_s``) that its NVML is hung
        (``gpulens_node_nvml_hung``), with since when as far as the store knows; ``NotAvailableOnBackend`` where
        the store does not keep it."""
        ...

    def drain_actions(self, limit: int = 50) -> list[dict[str, Any]]:
        """The newest ``limit`` slurm-drain decisions (``[[alerts.actions]]``), newest first."""
        ...

    def remediation_state(self) -> dict[str, Any]:
        """Remediation's brake (``halt``: its time and reason, or None) and the nodes it holds drained (``held``,
        each with its open causes): ``storage.remediationstore.remediation_state``."""
        ...

    def snapshot(self) -> AbstractContextManager[StoreReader]:
        """A reader of one consistent moment of the store for the block (a SQL store: one session and transaction);
        a store without such moments gives itself."""
        ...

    def close(self) -> None: ...
