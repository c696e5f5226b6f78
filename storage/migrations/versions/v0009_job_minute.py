"""The per-job minute aggregate ``job_minute`` (``gpulens.storage.jobminute``), filled for the last day of the store.

One row per (minute, job): utilization's sample count, sum and sum of squares, memory used's sample count, sum and
maximum, in stored units. The writer keeps it current from this revision on; the jobs and job pages read it instead of
joining every GPU's 1-minute rollups.

Backfill, bounded to the last ``BACKFILL_MS`` (a day) before the newest sample: minutes below the 1-minute rollup
position from ``gpu_rollup_1m`` (a bucket counts for the jobs whose allocation covers its start, as ``jobstats`` read
them before; the sum of squares comes from the bucket means, as before), later minutes from the raw samples. The
``tier_state`` row ``job`` records the first minute covered (``horizon_ms``); ``storage.jobstats`` reads the time
before it from the rollups as it did before. A store with no sample gets no horizon (the table covers everything).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision: str | None = "0008"
branch_labels: str | None = None
depends_on: str | None = None
# It copies no table: the backfill writes job_minute from the last day only (`gpulens db upgrade --plan`).
rewrites: dict[str, tuple[str, ...]] = {}

BACKFILL_MS = 86_400_000
_MINUTE_MS = 60_000
_COLUMNS = "ts_ms, job_id, util_n, util_sum, util_sq, memory_n, memory_sum, memory_max"
# The stored columns read (frozen at 0008: utilization and memory used stay in the sample rows).
_UTIL, _MEMORY = "utilization_per10k", "memory_used_kib"
_COVERS = "AND s.ts_ms >= a.start_ms AND (a.end_ms IS NULL OR s.ts_ms <= a.end_ms)"


def _from_rollups(dialect: str) -> str:
    bigint = "bigint" if dialect == "postgresql" else "INTEGER"
    u, m = f"s.{_UTIL}_mean", f"s.{_MEMORY}_mean"
    return (
        f"INSERT INTO job_minute ({_COLUMNS}) SELECT s.ts_ms, a.job_id, "  # noqa: S608
        f"coalesce(sum(CASE WHEN {u} IS NOT NULL THEN s.n END), 0), "
        f"coalesce(CAST(round(sum({u} * s.n)) AS {bigint}), 0), "
        f"coalesce(CAST(round(sum({u} * {u} * s.n)) AS {bigint}), 0), "
        f"coalesce(sum(CASE WHEN {m} IS NOT NULL THEN s.n END), 0), "
        f"coalesce(CAST(round(sum({m} * s.n)) AS {bigint}), 0), "
        f"max(s.{_MEMORY}_max) FROM gpu_rollup_1m AS s JOIN job_allocation AS a ON a.gpu_id = s.gpu_id {_COVERS} "
        "WHERE s.ts_ms >= :lo AND s.ts_ms < :hi GROUP BY s.ts_ms, a.job_id"
    )


def _from_samples(dialect: str, minutes: list[int]) -> str:
    source = " UNION ALL ".join(f"SELECT {int(m)} AS m" for m in minutes)
    minute = "(s.ts_ms / 60000) * 60000"
    index_hint = " AND s.ts_ms / 60000 = src.m / 60000" if dialect == "sqlite" else ""
    return (
        f"INSERT INTO job_minute ({_COLUMNS}) SELECT {minute}, a.job_id, count(s.{_UTIL}), "  # noqa: S608
        f"coalesce(sum(s.{_UTIL}), 0), coalesce(sum(CAST(s.{_UTIL} AS BIGINT) * s.{_UTIL}), 0), count(s.{_MEMORY}), "
        f"coalesce(sum(s.{_MEMORY}), 0), max(s.{_MEMORY}) FROM ({source}) AS src JOIN gpu_sample AS s "
        f"ON s.ts_ms >= src.m AND s.ts_ms < src.m + 60000{index_hint} "
        f"JOIN job_allocation AS a ON a.gpu_id = s.gpu_id {_COVERS} GROUP BY {minute}, a.job_id"
    )


def upgrade() -> None:
    op.create_table(
        "job_minute",
        sa.Column("ts_ms", sa.BigInteger, nullable=False),
        sa.Column("job_id", sa.Text, nullable=False),
        sa.Column("util_n", sa.Integer, nullable=False),
        sa.Column("util_sum", sa.BigInteger, nullable=False),
        sa.Column("util_sq", sa.BigInteger, nullable=False),
        sa.Column("memory_n", sa.Integer, nullable=False),
        sa.Column("memory_sum", sa.BigInteger, nullable=False),
        sa.Column("memory_max", sa.BigInteger),
        sa.PrimaryKeyConstraint("ts_ms", "job_id"),
        sqlite_with_rowid=False,
    )
    op.create_index("ix_job_minute_job_id", "job_minute", ["job_id", "ts_ms"])
    conn = op.get_bind()
    dialect = conn.dialect.name
    newest = conn.exec_driver_sql("SELECT max(last_seen_ms) FROM gpu").scalar()
    horizon = None
    if newest is not None:
        newest = int(newest) + _MINUTE_MS  # the newest sample is within a minute of gpu.last_seen_ms
        horizon = (newest - BACKFILL_MS) - (newest - BACKFILL_MS) % _MINUTE_MS
        position = conn.exec_driver_sql("SELECT position_ms FROM tier_state WHERE tier = '1m'").scalar()
        raw_from = horizon if position is None else max(horizon, int(position))
        if raw_from > horizon:
            conn.execute(sa.text(_from_rollups(dialect)), {"lo": horizon, "hi": raw_from})
        minutes = list(range(raw_from, newest + _MINUTE_MS, _MINUTE_MS))
        for i in range(0, len(minutes), 60):  # an hour of raw samples per statement
            conn.exec_driver_sql(_from_samples(dialect, minutes[i : i + 60]))
    conn.execute(
        sa.text("INSERT INTO tier_state (tier, position_ms, horizon_ms) VALUES ('job', NULL, :horizon)"),
        {"horizon": horizon},
    )


def downgrade() -> None:
    op.execute("DELETE FROM tier_state WHERE tier = 'job'")
    op.drop_index("ix_job_minute_job_id", table_name="job_minute")
    op.drop_table("job_minute")
