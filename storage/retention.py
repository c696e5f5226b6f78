"""Retention: how long each tier is kept. PostgreSQL drops whole partitions; SQLite deletes in small transactions.

Each tier's cutoff is recorded as its horizon in ``tier_state``, so ``timeseries.series`` does not choose a tier whose
data for the range is gone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

import sqlalchemy as sa

from storage import schema
from storage.db import Database

log = logging.getLogger(__name__)

DAY_S: Final = 86_400.0
_SQLITE_SAMPLE_CHUNK_MINUTES: Final = 5  # raw rows deleted per transaction: this many minutes of samples
_SQLITE_ROLLUP_CHUNK_GPUS: Final = 500  # rollup rows deleted per transaction: this many GPUs' old rows


@dataclass(frozen=True, slots=True)
class Retention:
    """Seconds to keep raw samples, 1-minute and 1-hour rollups."""

    raw_s: float = 7 * DAY_S
    minute_s: float = 90 * DAY_S
    hour_s: float = 730 * DAY_S

    def __post_init__(self) -> None:
        if min(self.raw_s, self.minute_s, self.hour_s) <= 0:
            raise ValueError("retention periods must be positive")


def apply_retention(db: Database, now: float, retention: Retention) -> dict[str, int]:
    """Remove data older than the retention periods.

    Returns counts keyed ``TABLE.rows`` (rows deleted) or ``TABLE.partitions`` (PostgreSQL partitions dropped).
    A PostgreSQL partition goes once all of it is past the cutoff, so up to a partition's width more is kept.
    """
    cutoffs = {
        "gpu_sample": round((now - retention.raw_s) * 1000),
        "gpu_rollup_1m": round((now - retention.minute_s) * 1000),
        "gpu_rollup_1h": round((now - retention.hour_s) * 1000),
    }
    removed: dict[str, int] = {}
    for (table, cutoff), tier in zip(cutoffs.items(), schema.TIERS, strict=True):
        if db.dialect == "postgresql":
            removed[f"{table}.partitions"] = _drop_partitions(db, table, cutoff)
        elif table == "gpu_sample":
            removed[f"{table}.rows"] = _delete_samples(db, cutoff)
        else:
            removed[f"{table}.rows"] = _delete_rollups(db, table, cutoff)
        with db.write_transaction() as conn:
            t = schema.tier_state
            conn.execute(sa.update(t).where(t.c.tier == tier).values(horizon_ms=cutoff))
    removed.update(_delete_small_tables(db, cutoffs["gpu_sample"], cutoffs["gpu_rollup_1h"]))
    if any(removed.values()):
        log.info("retention removed %s", ", ".join(f"{k}={v}" for k, v in sorted(removed.items()) if v))
    return removed


def _drop_partitions(db: Database, table: str, cutoff_ms: int) -> int:
    width = schema.PARTITION_WIDTH_MS[table]
    with db.session() as session:
        partitions = schema.existing_partitions(session.connection(), table)
    dropped = 0
    for name, start in sorted(partitions.items(), key=lambda item: item[1]):
        if start + width > cutoff_ms:
            continue
        with db.write_transaction() as conn:
            conn.exec_driver_sql(f'DROP TABLE IF EXISTS "{name}"')
        db.forget_partition(table, start)
        dropped += 1
    return dropped


def _delete_samples(db: Database, cutoff_ms: int) -> int:
    """SQLite: delete raw samples a few minutes at a time along the minute-leading index."""
    cutoff_minute = cutoff_ms // schema.MINUTE_MS
    deleted = 0
    while True:
        with db.write_transaction() as conn:
            oldest = conn.exec_driver_sql(
                "SELECT ts_ms / 60000 FROM gpu_sample ORDER BY ts_ms / 60000 LIMIT 1"
            ).scalar_one_or_none()
            if oldest is None or oldest > cutoff_minute:
                return deleted
            upto = min(cutoff_minute + 1, oldest + _SQLITE_SAMPLE_CHUNK_MINUTES)
            deleted += conn.exec_driver_sql(
                "DELETE FROM gpu_sample WHERE ts_ms / 60000 >= ? AND ts_ms / 60000 < ? AND ts_ms < ?",
                (oldest, upto, cutoff_ms),
            ).rowcount
            if upto > cutoff_minute:
                return deleted


def _delete_rollups(db: Database, table: str, cutoff_ms: int) -> int:
    """SQLite: delete a rollup table's old rows a few hundred GPUs at a time (the table is clustered by GPU)."""
    with db.session() as session:
        gpu_ids = list(session.execute(sa.select(schema.gpu.c.id).order_by(schema.gpu.c.id)).scalars())
    rollup = schema.metadata.tables[table]
    statement = sa.delete(rollup).where(rollup.c.gpu_id == sa.bindparam("b_gpu"), rollup.c.ts_ms < cutoff_ms)
    deleted = 0
    for i in range(0, len(gpu_ids), _SQLITE_ROLLUP_CHUNK_GPUS):
        with db.write_transaction() as conn:
            chunk = gpu_ids[i : i + _SQLITE_ROLLUP_CHUNK_GPUS]
            deleted += conn.execute(statement, [{"b_gpu": gpu_id} for gpu_id in chunk]).rowcount
    return deleted


def _delete_small_tables(db: Database, raw_cutoff_ms: int, hour_cutoff_ms: int) -> dict[str, int]:
    """Jobs and link outages live as long as the hourly rollups; targets gone for the raw period are forgotten."""
    a, n, t, g, p = (
        schema.job_allocation,
        schema.nvlink_down,
        schema.target_health,
        schema.gpu,
        schema.process_latest,
    )
    with db.write_transaction() as conn:
        jobs = conn.execute(sa.delete(a).where(a.c.end_ms < hour_cutoff_ms)).rowcount
        links = conn.execute(sa.delete(n).where(n.c.end_ms < hour_cutoff_ms)).rowcount
        targets = conn.execute(sa.delete(t).where(t.c.at < raw_cutoff_ms / 1000)).rowcount
        gone = sa.select(g.c.id).where(g.c.last_seen_ms < hour_cutoff_ms).scalar_subquery()
        for table in (a, n, p):
            conn.execute(sa.delete(table).where(table.c.gpu_id.in_(gone)))
        gpus = conn.execute(sa.delete(g).where(g.c.last_seen_ms < hour_cutoff_ms)).rowcount
    return {"job_allocation.rows": jobs, "nvlink_down.rows": links, "target_health.rows": targets, "gpu.rows": gpus}
