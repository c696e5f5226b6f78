"""Incremental 1-minute and 1-hour rollups (min/mean/max of gauges, increases of counters, OR of bitmasks).

The aggregate SQL itself comes from ``storage.aggregates``. Each tier keeps its position in ``tier_state``: every
bucket below it is rolled up, so a restarted process resumes where the last one stopped. Samples written below the
position (a replayed spool, a slow collector) leave a ``rollup_dirty`` mark and the next run recomputes their
buckets; rollup rows are upserted, so recomputing is safe. Each run works in chunks, one transaction each, holding
the tier's lock (``db.lock_tier``) so that writers of the tier's source queue behind it instead of slipping rows in
unseen.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from storage import aggregates, schema
from storage.db import Database, lock_tier

log = logging.getLogger(__name__)

# A counter's increase in a bucket counts from the sample before the bucket's first; look this far back for it.
# Every read of a range reads this much more, so it is kept to twice a slow (60 s) scrape interval.
COUNTER_LOOKBACK_MS: Final = 2 * schema.MINUTE_MS


@dataclass(frozen=True, slots=True)
class _Tier:
    name: str
    table: str
    source: str
    width_ms: int
    chunk_buckets: int  # buckets rolled up per transaction
    coarser: str | None  # the tier built from this one, told when old buckets are recomputed


_TIERS: Final = (
    _Tier("1m", "gpu_rollup_1m", "gpu_sample", schema.MINUTE_MS, 10, "1h"),
    _Tier("1h", "gpu_rollup_1h", "gpu_rollup_1m", schema.HOUR_MS, 1, None),
)


def _rollup_columns() -> list[str]:
    return ["gpu_id", "ts_ms", "n", "elapsed_ms", *aggregates.rollup_columns(schema.SAMPLE_FIELDS)]


def _upsert_tail(columns: list[str]) -> str:
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns[2:])
    return f"ON CONFLICT (gpu_id, ts_ms) DO UPDATE SET {updates}"


def _from_samples_sql(dialect: str) -> str:
    """1-minute buckets from raw samples.

    Gauges and bitmasks are aggregated straight off the rows of the range; counters' increases need each sample's
    predecessor (a window over a narrow projection: sorting wide rows for it measured twice as slow).
    """
    minute = f"ts_ms / {schema.MINUTE_MS}"
    gauges: list[str] = []
    counters: list[str] = []
    for f in schema.SAMPLE_FIELDS:
        named = [
            f"{sql} AS {f.column}_{aggregate}"
            for sql, aggregate in zip(aggregates.summary(f, "raw", dialect), f.aggregates, strict=True)
        ]
        (counters if f.kind == "counter" else gauges).extend(named)
    inner = aggregates.window_columns(schema.SAMPLE_FIELDS, counters_only=True)
    where, read_where = "ts_ms >= :lo AND ts_ms < :hi", "ts_ms >= :read_from AND ts_ms < :hi"
    if dialect == "sqlite":  # read through the minute-leading unique index
        where += f" AND {minute} BETWEEN :lo / {schema.MINUTE_MS} AND :hi / {schema.MINUTE_MS}"
        read_where += f" AND {minute} BETWEEN :read_from / {schema.MINUTE_MS} AND :hi / {schema.MINUTE_MS}"
    aggregated = (
        f"SELECT gpu_id, {minute} AS minute, count(*) AS n, {', '.join(gauges)} "  # noqa: S608
        f"FROM gpu_sample WHERE {where} GROUP BY {minute}, gpu_id"
    )
    increases = (
        f"SELECT gpu_id, {minute} AS minute, sum(dt) AS elapsed_ms, {', '.join(counters)} "  # noqa: S608
        f"FROM (SELECT {', '.join(inner)} FROM gpu_sample WHERE {read_where} "
        "WINDOW w AS (PARTITION BY gpu_id ORDER BY ts_ms)) AS x "
        f"WHERE ts_ms >= :lo GROUP BY gpu_id, {minute}"
    )
    columns = _rollup_columns()
    values = [
        f"a.minute * {schema.MINUTE_MS}"
        if c == "ts_ms"
        else f"c.{c}"
        if c == "elapsed_ms" or c.endswith("_increase")
        else f"a.{c}"
        for c in columns
    ]
    return (
        f"INSERT INTO gpu_rollup_1m ({', '.join(columns)}) "  # noqa: S608 (identifiers are constants)
        f"SELECT {', '.join(values)} FROM ({aggregated}) AS a LEFT JOIN ({increases}) AS c "
        f"ON c.gpu_id = a.gpu_id AND c.minute = a.minute WHERE true {_upsert_tail(columns)}"
    )


def _from_minutes_sql(dialect: str) -> str:
    """1-hour buckets from 1-minute ones: means weighted by sample counts."""
    outer = ["r.gpu_id", f"(r.ts_ms / {schema.HOUR_MS}) * {schema.HOUR_MS}", "sum(r.n)", "sum(r.elapsed_ms)"]
    for f in schema.SAMPLE_FIELDS:
        outer += aggregates.summary(f, "1m", dialect, prefix="r.")
    # The 1-minute table is clustered by GPU: drive the read GPU by GPU (SQLite's CROSS JOIN keeps this order).
    join = (
        "gpu AS g CROSS JOIN gpu_rollup_1m AS r" if dialect == "sqlite" else "gpu AS g JOIN gpu_rollup_1m AS r ON true"
    )
    columns = _rollup_columns()
    return (
        f"INSERT INTO gpu_rollup_1h ({', '.join(columns)}) "  # noqa: S608 (identifiers are constants)
        f"SELECT {', '.join(outer)} FROM {join} WHERE r.gpu_id = g.id AND r.ts_ms >= :lo AND r.ts_ms < :hi "
        f"GROUP BY r.gpu_id, (r.ts_ms / {schema.HOUR_MS}) {_upsert_tail(columns)}"
    )


class Rollups:
    """Builds the 1-minute and 1-hour tables incrementally; ``run`` is what the collector schedules."""

    def __init__(self, db: Database, *, settle_s: float = 30.0) -> None:
        """``settle_s``: roll a minute up only this long after it ends, so most samples are in by then."""
        self._db = db
        self._settle_ms = round(settle_s * 1000)
        self._sql = {"1m": _from_samples_sql(db.dialect), "1h": _from_minutes_sql(db.dialect)}

    def run(self, now: float) -> int:
        """Roll up every complete bucket not yet rolled up, and recompute dirty ones. Returns rows written."""
        written = 0
        for tier in _TIERS:
            limit = self._limit(tier, round(now * 1000))
            rows: int | None = -1
            while rows is not None:
                rows = self._step(tier, limit, skip_gap=rows == 0)
                written += rows or 0
        return written

    def _limit(self, tier: _Tier, now_ms: int) -> int:
        """Buckets that start below the limit are complete."""
        if tier.name == "1m":
            end = now_ms - self._settle_ms
        else:
            with self._db.session() as session:
                t = schema.tier_state
                end = session.execute(sa.select(t.c.position_ms).where(t.c.tier == "1m")).scalar_one() or 0
        return end - end % tier.width_ms

    def _step(self, tier: _Tier, limit: int, *, skip_gap: bool) -> int | None:
        """Roll up one chunk in one transaction; None when there is nothing left to do.

        ``skip_gap``: the last chunk was empty, so jump to the next raw sample rather than walk an idle stretch.
        """
        with self._db.write_transaction() as conn:
            lock_tier(conn, tier.name, exclusive=True)
            position, dirty = self._state(conn, tier)
            if position is None:
                position = self._first_bucket(conn, tier)
                if position is None:
                    return None
            lo = min(position, dirty) if dirty is not None else position
            if skip_gap and dirty is None and tier.name == "1m":
                lo = self._next_sample_minute(conn, lo, limit)
            if lo >= limit:
                return None
            hi = min(limit, lo + tier.width_ms * tier.chunk_buckets)
            self._db.ensure_partitions(tier.table, range(lo, hi, tier.width_ms))
            params = {"lo": lo, "hi": hi, "read_from": lo - COUNTER_LOOKBACK_MS}
            rows = int(conn.execute(sa.text(self._sql[tier.name]), params).rowcount)
            self._advance(conn, tier, position, lo, hi)
        log.debug("rollup %s: %d rows for [%d, %d)", tier.name, rows, lo, hi)
        return rows

    @staticmethod
    def _state(conn: Connection, tier: _Tier) -> tuple[int | None, int | None]:
        t, d = schema.tier_state, schema.rollup_dirty
        position = conn.execute(sa.select(t.c.position_ms).where(t.c.tier == tier.name)).scalar_one()
        dirty = conn.execute(sa.select(sa.func.min(d.c.from_ms)).where(d.c.tier == tier.name)).scalar_one()
        if dirty is not None:
            dirty -= dirty % tier.width_ms
        return position, dirty

    def _next_sample_minute(self, conn: Connection, lo: int, limit: int) -> int:
        """The minute of the first raw sample in [lo, limit), or limit if there is none."""
        if self._db.dialect == "sqlite":
            sql = (
                "SELECT ts_ms FROM gpu_sample WHERE ts_ms / 60000 >= :lo / 60000 AND ts_ms / 60000 < :limit / 60000 "
                "ORDER BY ts_ms / 60000 LIMIT 1"
            )
        else:
            sql = "SELECT min(ts_ms) FROM gpu_sample WHERE ts_ms >= :lo AND ts_ms < :limit"
        first = conn.execute(sa.text(sql), {"lo": lo, "limit": limit}).scalar()
        return limit if first is None else max(lo, first - first % schema.MINUTE_MS)

    @staticmethod
    def _first_bucket(conn: Connection, tier: _Tier) -> int | None:
        """Where a tier that never ran starts: the bucket of the first sample ever stored."""
        first = conn.execute(sa.select(sa.func.min(schema.gpu.c.first_seen_ms))).scalar_one()
        return None if first is None else first - first % tier.width_ms

    @staticmethod
    def _advance(conn: Connection, tier: _Tier, position: int, lo: int, hi: int) -> None:
        """Move the position past [lo, hi); keep a dirty mark for what is left to recompute below the position."""
        t, d = schema.tier_state, schema.rollup_dirty
        conn.execute(sa.delete(d).where(d.c.tier == tier.name))
        if hi < position:
            conn.execute(sa.insert(d).values(tier=tier.name, from_ms=hi))
        conn.execute(sa.update(t).where(t.c.tier == tier.name).values(position_ms=max(position, hi)))
        if tier.coarser is None:
            return
        coarser_position = conn.execute(sa.select(t.c.position_ms).where(t.c.tier == tier.coarser)).scalar_one()
        if coarser_position is not None and lo < coarser_position:
            lock_tier(conn, tier.coarser, exclusive=False)
            conn.execute(sa.insert(d).values(tier=tier.coarser, from_ms=lo))
