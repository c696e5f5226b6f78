"""The scheduler's side of jobs: Slurm's metadata of each job (``job_info``) and the slurm-drain audit
(``drain_action``: every drain taken, dry-run or refused), with their writes and reads.

``job_info`` keeps one row per job id, the latest that an exporter reported (name, user, account, partition, array
job and task, submit and start time in Unix seconds). ``drain_action`` keeps one row per decision of a
``[[alerts.actions]]`` entry; the alerts page lists the newest.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

import sqlalchemy as sa

from gpulens.model import JobInfo
from gpulens.storage.schema import metadata

if TYPE_CHECKING:  # db imports schema, which imports this module
    from sqlalchemy.engine import Connection

    from gpulens.storage.db import Database

job_info: Final = sa.Table(
    "job_info",
    metadata,
    sa.Column("job_id", sa.Text, primary_key=True),
    sa.Column("node", sa.Text, nullable=False),
    sa.Column("name", sa.Text),
    sa.Column("user_name", sa.Text),
    sa.Column("account", sa.Text),
    sa.Column("partition", sa.Text),
    sa.Column("array_job_id", sa.Text),
    sa.Column("array_task_id", sa.Integer),
    sa.Column("submit_time", sa.Double),
    sa.Column("start_time", sa.Double),
    sa.Column("updated_at", sa.Double, nullable=False),
)

drain_action: Final = sa.Table(
    "drain_action",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("time", sa.Double, nullable=False),
    sa.Column("action", sa.Text, nullable=False),
    sa.Column("node", sa.Text, nullable=False),
    sa.Column("gpu", sa.Text, nullable=False),
    sa.Column("rule", sa.Text, nullable=False),
    sa.Column("outcome", sa.Text, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("step", sa.Text),  # drain, resume, requeue, command (revision 0018; NULL before)
    sa.Column("causes", sa.Text),  # the incidents or alerts that caused it, space-separated (0018)
    sa.Index("ix_drain_action_time", "time"),
)

# Remediation's memory (revision 0018; read and written by storage.remediationstore).
remediation_node: Final = sa.Table(
    "remediation_node",
    metadata,
    sa.Column("node", sa.String(255), primary_key=True),
    sa.Column("action", sa.Text, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("drained_at", sa.Double, nullable=False),
    sa.Column("held", sa.Boolean, nullable=False),
    sa.Column("dry_run", sa.Boolean, nullable=False),
)

remediation_cause: Final = sa.Table(
    "remediation_cause",
    metadata,
    sa.Column("node", sa.String(255), primary_key=True),
    sa.Column("cause", sa.String(255), primary_key=True),
    sa.Column("action", sa.Text, nullable=False),
    sa.Column("opened_at", sa.Double, nullable=False),
    sa.Column("summary", sa.Text, nullable=False),
)

remediation_halt: Final = sa.Table(
    "remediation_halt",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("halted_at", sa.Double, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("lifted_at", sa.Double),
    sa.Column("lifted_by", sa.Text),
)


_INFO_COLUMNS: Final = (
    "node",
    "name",
    "account",
    "partition",
    "array_job_id",
    "array_task_id",
    "submit_time",
    "start_time",
)


def write_job_info(conn: Connection, infos: Iterable[JobInfo], now: float) -> int:
    """Store (insert or replace) each job's metadata in the caller's transaction; the number of jobs written."""
    rows = {i.job_id: i for i in infos}
    if not rows:
        return 0
    known = set(conn.execute(sa.select(job_info.c.job_id).where(job_info.c.job_id.in_(rows))).scalars())
    for job_id, info in rows.items():
        values: dict[str, Any] = {c: getattr(info, c) for c in _INFO_COLUMNS}
        values.update(user_name=info.user, updated_at=now)
        if job_id in known:
            conn.execute(sa.update(job_info).where(job_info.c.job_id == job_id).values(**values))
        else:
            conn.execute(sa.insert(job_info).values(job_id=job_id, **values))
    return len(rows)


def read_job_info(db: Database, job_ids: Iterable[str]) -> dict[str, JobInfo]:
    """Job id -> stored metadata, for the ids known."""
    ids = list(job_ids)
    if not ids:
        return {}
    with db.session() as s:
        rows = s.execute(sa.select(job_info).where(job_info.c.job_id.in_(ids))).mappings().all()
    return {
        r["job_id"]: JobInfo(job_id=r["job_id"], user=r["user_name"], **{c: r[c] for c in _INFO_COLUMNS}) for r in rows
    }


def record_drain_action(db: Database, record: Any) -> None:
    """Store one ``gpulens.alerts.remediationcase.DrainRecord`` (taken as any object with its fields: storage is
    below alerts)."""
    fields = ("time", "action", "node", "gpu", "rule", "outcome", "reason", "step", "causes")
    with db.write_transaction() as conn:
        conn.execute(sa.insert(drain_action).values(**{f: getattr(record, f) for f in fields}))


def recent_drain_actions(db: Database, limit: int = 50) -> list[dict[str, Any]]:
    """The newest ``limit`` drain decisions, newest first."""
    with db.session() as s:
        rows = (
            s.execute(
                sa.select(drain_action).order_by(drain_action.c.time.desc(), drain_action.c.id.desc()).limit(limit)
            )
            .mappings()
            .all()
        )
    return [dict(r) for r in rows]


def decisions_for(db: Database, cause: str, limit: int = 5) -> list[dict[str, Any]]:
    """The newest ``limit`` decisions about one incident or alert (``causes`` names it), newest first."""
    with db.session() as s:
        rows = (
            s.execute(
                sa.select(drain_action)
                .where(drain_action.c.causes == cause)
                .order_by(drain_action.c.time.desc(), drain_action.c.id.desc())
                .limit(limit)
            )
            .mappings()
            .all()
        )
    return [dict(r) for r in rows]
