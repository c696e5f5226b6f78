"""Retention: how long each tier is kept. PostgreSQL drops whole partitions; SQLite deletes in small transactions.

Every family's tables (GPUs, RDMA ports, hosts, jobs' hosts: ``gpulens.storage.fabricschema.FAMILIES``) are kept alike.

The per-job minute aggregate (``storage.jobminute``) is kept as long as the 1-minute rollups, deleted a span of minutes
at a time on either backend. Each tier's cutoff is recorded as its horizon in ``tier_state``, so ``timeseries.series``
does not choose a tier whose data for the range is gone. ``apply_retention`` does a whole pass at once;
``RetentionJob.step`` does the same pass in pieces sized to take about ``max_seconds`` each, for the collector to run
between scrape rounds.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Final

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpulens.storage import fabricschema, inspectorstore, jobminute, ncclstore, partitions, schema
from gpulens.storage.db import Database
from gpulens.storage.fabricschema import FAMILIES, Family
from gpulens.storage.rollup import next_slice

log = logging.getLogger(__name__)

DAY_S: Final = 86_400.0
_SQLITE_SAMPLE_CHUNK_MINUTES: Final = 5  # raw rows deleted per transaction: this many minutes of samples
_SQLITE_ROLLUP_CHUNK_GPUS: Final = 500  # rollup rows deleted per transaction: this many GPUs' old rows
_JOB_MINUTE_CHUNK_MINUTES: Final = 60  # per-job aggregate rows deleted per step at first: this many minutes' rows


@dataclass(frozen=True, slots=True)
class Retention:
    """Seconds to keep raw samples, 1-minute and 1-hour rollups."""

    raw_s: float = 7 * DAY_S
    minute_s: float = 90 * DAY_S
    hour_s: float = 730 * DAY_S

    def __post_init__(self) -> None:
        if min(self.raw_s, self.minute_s, self.hour_s) <= 0:
            raise ValueError("retention periods must be positive")


def _tier_cutoffs(now: float, retention: Retention) -> dict[str, int]:
    return {
        "raw": round((now - retention.raw_s) * 1000),
        "1m": round((now - retention.minute_s) * 1000),
        "1h": round((now - retention.hour_s) * 1000),
    }


def _table_cutoffs(tier_cutoffs: dict[str, int]) -> dict[str, tuple[Family, str, int]]:
    """Every tier table of every family (GPUs, ports, hosts, jobs' hosts): (family, tier, cutoff)."""
    return {f.table(tier): (f, tier, tier_cutoffs[tier]) for f in FAMILIES for tier in schema.TIERS}


def apply_retention(db: Database, now: float, retention: Retention) -> dict[str, int]:
    """Remove data older than the retention periods.

    Returns counts keyed ``TABLE.rows`` (rows deleted) or ``TABLE.partitions`` (PostgreSQL partitions dropped).
    A PostgreSQL partition goes once all of it is past the cutoff, so up to a partition's width more is kept.
    """
    tier_cutoffs = _tier_cutoffs(now, retention)
    removed: dict[str, int] = {}
    for table, (family, tier, cutoff) in _table_cutoffs(tier_cutoffs).items():
        if db.dialect == "postgresql":
            removed[f"{table}.partitions"] = _drop_partitions(db, table, cutoff)
        elif tier == "raw":
            removed[f"{table}.rows"] = _delete_samples(db, cutoff, family)
        else:
            removed[f"{table}.rows"] = _delete_rollups(db, table, cutoff, family)
    with db.write_transaction() as conn:
        removed["job_minute.rows"] = _delete_job_minutes(conn, tier_cutoffs["1m"])
        _record_horizons(conn, tier_cutoffs)
    removed.update(_delete_small_tables(db, tier_cutoffs["raw"], tier_cutoffs["1h"]))
    if any(removed.values()):
        log.info("retention removed %s", ", ".join(f"{k}={v}" for k, v in sorted(removed.items()) if v))
    return removed


def _drop_partitions(db: Database, table: str, cutoff_ms: int) -> int:
    width = partitions.PARTITION_WIDTH_MS[table]
    with db.session() as session:
        existing = partitions.existing_partitions(session.connection(), table)
    dropped = 0
    for name, start in sorted(existing.items(), key=lambda item: item[1]):
        if start + width > cutoff_ms:
            continue
        with db.write_transaction() as conn:
            conn.exec_driver_sql(f'DROP TABLE IF EXISTS "{name}"')
        db.forget_partition(table, start)
        dropped += 1
    return dropped


def _delete_samples(db: Database, cutoff_ms: int, family: Family = fabricschema.GPU) -> int:
    """SQLite: delete raw samples a few minutes at a time along the primary key, which leads with the minute."""
    table = family.sample
    cutoff_minute = schema.stored_minute(cutoff_ms)
    deleted = 0
    while True:
        with db.write_transaction() as conn:
            oldest = conn.exec_driver_sql(
                f"SELECT minute FROM {table} ORDER BY minute LIMIT 1"  # noqa: S608
            ).scalar_one_or_none()
            if oldest is None or oldest > cutoff_minute:
                return deleted
            upto = min(cutoff_minute + 1, oldest + _SQLITE_SAMPLE_CHUNK_MINUTES)
            deleted += conn.exec_driver_sql(
                f"DELETE FROM {table} WHERE minute >= ? AND minute < ? AND ts_ms < ?",  # noqa: S608
                (oldest, upto, cutoff_ms),
            ).rowcount
            if upto > cutoff_minute:
                return deleted


def _delete_rollups(db: Database, table: str, cutoff_ms: int, family: Family = fabricschema.GPU) -> int:
    """SQLite: delete a rollup table's old rows a few hundred ids at a time (the table is clustered by id)."""
    dimension = schema.metadata.tables[family.dimension]
    with db.session() as session:
        gpu_ids = list(session.execute(sa.select(dimension.c.id).order_by(dimension.c.id)).scalars())
    rollup = schema.metadata.tables[table]
    statement = sa.delete(rollup).where(rollup.c[family.key] == sa.bindparam("b_gpu"), rollup.c.ts_ms < cutoff_ms)
    deleted = 0
    for i in range(0, len(gpu_ids), _SQLITE_ROLLUP_CHUNK_GPUS):
        with db.write_transaction() as conn:
            chunk = gpu_ids[i : i + _SQLITE_ROLLUP_CHUNK_GPUS]
            deleted += conn.execute(statement, [{"b_gpu": gpu_id} for gpu_id in chunk]).rowcount
    return deleted


def _delete_job_minutes(conn: Connection, below_ms: int) -> int:
    m = jobminute.job_minute
    return int(conn.execute(sa.delete(m).where(m.c.ts_ms < below_ms)).rowcount)


def _record_horizons(conn: Connection, tier_cutoffs: dict[str, int]) -> None:
    """Each tier's cutoff as its horizon; the per-job aggregate's moves up to the 1-minute tier's, never down."""
    t = schema.tier_state
    for tier, cutoff in tier_cutoffs.items():
        conn.execute(sa.update(t).where(t.c.tier == tier).values(horizon_ms=cutoff))
    cutoff = tier_cutoffs["1m"]
    job = t.c.tier == jobminute.TIER
    conn.execute(
        sa.update(t).where(job, sa.or_(t.c.horizon_ms.is_(None), t.c.horizon_ms < cutoff)).values(horizon_ms=cutoff)
    )


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
        nccl = ncclstore.prune(conn, raw_cutoff_ms) + inspectorstore.prune(conn, raw_cutoff_ms)
        gone = sa.select(g.c.id).where(g.c.last_seen_ms < hour_cutoff_ms).scalar_subquery()
        for table in (a, n, p):
            conn.execute(sa.delete(table).where(table.c.gpu_id.in_(gone)))
        gpus = conn.execute(sa.delete(g).where(g.c.last_seen_ms < hour_cutoff_ms)).rowcount
        # Ports, hosts and jobs' hosts not seen for the hourly period: their rows are gone already.
        fabric = {
            f"{d.name}.rows": conn.execute(sa.delete(d).where(d.c.last_seen_ms < hour_cutoff_ms)).rowcount
            for d in (fabricschema.nic, fabricschema.host, fabricschema.job_host)
        }
    return {
        "job_allocation.rows": jobs,
        "nvlink_down.rows": links,
        "target_health.rows": targets,
        "gpu.rows": gpus,
        "nccl.rows": nccl,
    } | fabric


@dataclass(slots=True)
class _Piece:
    """What is left of one part of a retention pass: a table to trim GPU slice by GPU slice, or partitions to drop."""

    kind: str  # "drop" (PostgreSQL partitions) | "samples" | "rollup" (SQLite rows) | "job_minute" | "finish"
    table: str
    cutoff_ms: int
    family: Family = fabricschema.GPU
    partitions: list[tuple[str, int]] = field(default_factory=list)  # "drop": (name, start) left to drop
    minute: int | None = None  # "samples": the minute being deleted
    next_gpu: int = 0  # "samples", "rollup": the first GPU id of the next slice


class RetentionJob:
    """``apply_retention`` in pieces: each ``step`` is one short transaction, sized to take about ``max_seconds``.

    A pass starts at the first ``step`` once ``every_s`` has gone by since the last one started. PostgreSQL drops one
    partition per step. SQLite deletes raw samples one minute and one slice of GPUs at a time, whole minutes before
    the cutoff's minute (the rest goes in the next pass), and rollup rows one slice of GPUs at a time. The last step
    of a pass records the horizons and trims the small tables. ``removed`` counts what the current or last pass
    removed, keyed as ``apply_retention``'s result.
    """

    def __init__(self, db: Database, retention: Retention, *, every_s: float = 3600.0, slice_gpus: int = 256) -> None:
        self._db = db
        self._retention = retention
        self._every_s = every_s
        self._pieces: list[_Piece] = []
        self._started: float | None = None
        self._slice = dict.fromkeys(("samples", "rollup"), max(1, slice_gpus))
        self._slice["job_minute"] = _JOB_MINUTE_CHUNK_MINUTES
        self._cutoffs: dict[str, int] = {}  # per tier
        self.removed: dict[str, int] = {}
        self.longest_step_s = 0.0

    def step(self, now: float, *, max_seconds: float = 0.05) -> bool:
        """Do one piece of the current pass (starting one if due); True while more of the pass is pending."""
        if not self._pieces:
            if self._started is not None and now - self._started < self._every_s:
                return False
            self._start(now)
        started = time.perf_counter()
        piece = self._pieces[0]
        if piece.kind == "drop":
            self._drop_one(piece)
        elif piece.kind == "finish":
            self._finish()
            self._pieces.pop(0)
        elif piece.kind == "job_minute":
            self._delete_job_minutes(piece)
        else:
            self._delete_slice(piece)
        elapsed = time.perf_counter() - started
        self.longest_step_s = max(self.longest_step_s, elapsed)
        if piece.kind in self._slice:
            self._slice[piece.kind] = next_slice(self._slice[piece.kind], elapsed, max_seconds)
        return bool(self._pieces)

    def _start(self, now: float) -> None:
        self._started = now
        self.removed = {}
        self._cutoffs = _tier_cutoffs(now, self._retention)
        for table, (family, tier, cutoff) in _table_cutoffs(self._cutoffs).items():
            if self._db.dialect == "postgresql":
                width = partitions.PARTITION_WIDTH_MS[table]
                with self._db.session() as session:
                    existing = partitions.existing_partitions(session.connection(), table)
                gone = sorted(((n, s) for n, s in existing.items() if s + width <= cutoff), key=lambda p: p[1])
                self._pieces.append(_Piece("drop", table, cutoff, partitions=gone))
                self.removed[f"{table}.partitions"] = 0
            else:
                self._pieces.append(_Piece("samples" if tier == "raw" else "rollup", table, cutoff, family=family))
                self.removed[f"{table}.rows"] = 0
        self._pieces.append(_Piece("job_minute", "job_minute", self._cutoffs["1m"]))
        self.removed["job_minute.rows"] = 0
        self._pieces.append(_Piece("finish", "", 0))

    def _drop_one(self, piece: _Piece) -> None:
        if piece.partitions:
            name, start = piece.partitions.pop(0)
            with self._db.write_transaction() as conn:
                conn.exec_driver_sql(f'DROP TABLE IF EXISTS "{name}"')
            self._db.forget_partition(piece.table, start)
            self.removed[f"{piece.table}.partitions"] += 1
        if not piece.partitions:
            self._pieces.pop(0)

    def _delete_slice(self, piece: _Piece) -> None:
        """SQLite: delete one slice of GPUs' old rows of the piece's table."""
        size = self._slice[piece.kind]
        key = piece.family.key
        with self._db.write_transaction() as conn:
            dimension = schema.metadata.tables[piece.family.dimension]
            last_gpu = conn.execute(sa.select(sa.func.max(dimension.c.id))).scalar_one() or 0
            if piece.kind == "samples" and piece.minute is None:
                piece.minute = conn.exec_driver_sql(
                    f"SELECT minute FROM {piece.table} ORDER BY minute LIMIT 1"  # noqa: S608
                ).scalar_one_or_none()
                if piece.minute is None or piece.minute >= schema.stored_minute(piece.cutoff_ms):
                    self._pieces.pop(0)  # whole minutes only: the cutoff's own minute goes in the next pass
                    return
                piece.next_gpu = 0
            g0 = piece.next_gpu
            g1 = g0 + size if g0 + size <= last_gpu else 2**31 - 1  # the last slice takes any orphaned rows too
            if piece.kind == "samples":
                deleted = conn.exec_driver_sql(
                    f"DELETE FROM {piece.table} WHERE minute = ? AND {key} >= ? AND {key} < ?",  # noqa: S608
                    (piece.minute, g0, g1),
                ).rowcount
            else:
                deleted = conn.exec_driver_sql(
                    f"DELETE FROM {piece.table} WHERE {key} >= ? AND {key} < ? AND ts_ms < ?",  # noqa: S608
                    (g0, g1, piece.cutoff_ms),
                ).rowcount
        self.removed[f"{piece.table}.rows"] += deleted
        piece.next_gpu = g1
        if g1 > last_gpu:
            if piece.kind == "samples":
                piece.minute = None  # the next oldest minute, if any, on the next step
            else:
                self._pieces.pop(0)

    def _delete_job_minutes(self, piece: _Piece) -> None:
        """The per-job aggregate's oldest rows, a span of minutes (sized to the step's time) at a time."""
        with self._db.write_transaction() as conn:
            m = jobminute.job_minute
            oldest = conn.execute(sa.select(sa.func.min(m.c.ts_ms))).scalar_one_or_none()
            upto = (
                piece.cutoff_ms if oldest is None else min(piece.cutoff_ms, oldest + self._slice["job_minute"] * 60_000)
            )
            if oldest is not None and oldest < piece.cutoff_ms:
                self.removed["job_minute.rows"] += _delete_job_minutes(conn, upto)
        if upto >= piece.cutoff_ms:
            self._pieces.pop(0)

    def _finish(self) -> None:
        with self._db.write_transaction() as conn:
            _record_horizons(conn, self._cutoffs)
        self.removed.update(_delete_small_tables(self._db, self._cutoffs["raw"], self._cutoffs["1h"]))
        if any(self.removed.values()):
            log.info("retention removed %s", ", ".join(f"{k}={v}" for k, v in sorted(self.removed.items()) if v))
