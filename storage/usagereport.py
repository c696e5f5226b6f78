"""GPU usage per user, account or partition over a period: who held GPU-hours, and how much of them sat idle.

Each job that held a GPU in the period counts once, whole, with its accounting summary (``storage.jobsummary``): the
one stored when it ended, or one computed now for a job still running. A group adds its jobs' GPU-hours
allocated, the GPU-hours used (allocated less the idle share), the idle share weighted by GPU-hours, energy, cost,
and the jobs that hung (a ``CommunicationStall`` firing) with how long. Users come from the allocations (the
exporter serves them only with ``--user-names``), accounts and partitions from Slurm's job metadata (``job_info``);
a job without one is grouped under ``(unknown)``. ``rows`` (``storage.usagerows``) is the one computation of the
report from the jobs' accounts, over SQL (``usage``) and over Prometheus (``storage.prometheus.usageread``, which
reads the accounts from the exporters' series): ``gpulens report`` and the dashboard's Reports page both call the
store's ``usage``.
"""

from __future__ import annotations

import sqlalchemy as sa

from gpulens.settings import Prices
from gpulens.storage import jobsummary, schema, slurmtables
from gpulens.storage.db import Database
from gpulens.storage.records import JobAccount, UsageRow
from gpulens.storage.usagerows import GROUPINGS, MAX_JOBS, UNKNOWN, rows

__all__ = ["GROUPINGS", "MAX_JOBS", "UNKNOWN", "jobs_in", "rows", "usage"]


def jobs_in(db: Database, start: float, end: float) -> list[str]:
    """The jobs holding a GPU at some time in [start, end], at most ``MAX_JOBS``, oldest first."""
    a = schema.job_allocation
    query = (
        sa.select(a.c.job_id)
        .where(a.c.start_ms <= round(end * 1000))
        .where(sa.or_(a.c.end_ms.is_(None), a.c.end_ms >= round(start * 1000)))
        .group_by(a.c.job_id)
        .order_by(sa.func.min(a.c.start_ms))
        .limit(MAX_JOBS)
    )
    with db.session() as session:
        return list(session.execute(query).scalars())


def usage(db: Database, by: str, start: float, end: float, prices: Prices) -> list[UsageRow]:
    """One row per group, most GPU-hours first."""
    if by not in GROUPINGS:
        raise ValueError(f"by: expected one of {', '.join(GROUPINGS)}")
    accounts = [a for a in (_account(db, job, prices, end) for job in jobs_in(db, start, end)) if a is not None]
    return rows(accounts, _groups(db, by, accounts), prices.currency)


def _account(db: Database, job_id: str, prices: Prices, now: float) -> JobAccount | None:
    stored = jobsummary.stored(db, job_id) if jobsummary.has_table(db) else None
    return stored if stored is not None else jobsummary.summarise(db, job_id, prices, now=now)


def _groups(db: Database, by: str, accounts: list[JobAccount]) -> dict[str, str | None]:
    if by == "user":
        return {a.job_id: a.user for a in accounts}
    info = slurmtables.job_info
    column = info.c.account if by == "account" else info.c.partition
    ids = [a.job_id for a in accounts]
    with db.session() as session:
        rows = session.execute(sa.select(info.c.job_id, column).where(info.c.job_id.in_(ids))).all()
    return {job_id: value for job_id, value in rows}
