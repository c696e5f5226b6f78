"""The rollup rebuild: every 1-minute and 1-hour rollup row, and the per-job minutes, of a time range recomputed from
the raw samples, one time chunk per transaction.

Each chunk runs the live rollup's own statements (``rollup.from_samples_sql`` and ``rollup.from_minutes_sql``: one
definition of the aggregates) over every id of every family at once, set-wise, after deleting what the chunk held, so
a rebuild run twice gives the same rows, and a rollup row whose samples are gone goes too. ``job_minute`` is
recomputed the way the writer's late samples are (``jobminute.recompute``). An hour's 1-hour rows are built by the
chunk that completes the hour. A chunk takes the tiers' locks (``db.lock_tier``) for its own transaction only: on
SQLite, where a write transaction holds the database, a chunk of ``chunk_minutes`` is the longest a writer waits.

Where the rebuild reaches past a tier's position (an outage's minutes the live rollup has not caught up with), the
position moves to the chunk's end, as ``Rollups.run`` would move it; a position below the range is left where it is
(the live rollup goes on from there). What retention has removed (``tier_state`` horizons) is not rebuilt: the range
starts at the first hour whose raw samples are all kept.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpulens.storage import jobminute, schema
from gpulens.storage.db import Database, lock_tier
from gpulens.storage.fabricschema import FAMILIES
from gpulens.storage.rollup import ALL_IDS, COUNTER_LOOKBACK_MS, from_minutes_sql, from_samples_sql

DEFAULT_CHUNK_MINUTES: Final = 10
_DELETE: Final = "DELETE FROM {table} WHERE ts_ms >= :lo AND ts_ms < :hi"


@dataclass(frozen=True, slots=True)
class Progress:
    """Where a rebuild stands after a chunk: chunks done of all, rollup rows written so far, seconds since it began."""

    chunks_done: int
    chunks_total: int
    rows: int
    elapsed_s: float

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the pace so far; None before the first chunk."""
        if self.chunks_done == 0:
            return None
        return self.elapsed_s / self.chunks_done * (self.chunks_total - self.chunks_done)


def chunks(start_ms: int, end_ms: int, chunk_minutes: int) -> list[tuple[int, int]]:
    """The chunks [lo, hi) of the whole hours between ``start_ms`` and ``end_ms``: ``start_ms`` rounded down to its
    hour, ``end_ms`` down to its hour (an hour in progress is the live rollup's); each ``chunk_minutes`` long, which
    divides an hour or is a whole number of hours."""
    if chunk_minutes < 1 or (60 % chunk_minutes and chunk_minutes % 60):
        raise ValueError(f"chunk of {chunk_minutes} minutes: give a divisor of 60 or a multiple of 60")
    width = chunk_minutes * schema.MINUTE_MS
    lo = start_ms - start_ms % schema.HOUR_MS
    hi = end_ms - end_ms % schema.HOUR_MS
    return [(t, min(t + width, hi)) for t in range(lo, hi, width)]


def rebuild(
    db: Database,
    start: float,
    end: float,
    *,
    chunk_minutes: int = DEFAULT_CHUNK_MINUTES,
    progress: Callable[[Progress], None] | None = None,
    timer: Callable[[], float] = time.perf_counter,
) -> int:
    """Recompute the rollups of the whole hours in [``start``, ``end``) (seconds); returns the rollup rows written.

    ``progress`` is called after every chunk (and once before the first) with counts that only grow."""
    began = timer()
    first_ms, last_ms = _stored_span(db)
    planned = chunks(max(round(start * 1000), first_ms), min(round(end * 1000), last_ms), chunk_minutes)
    rows = 0
    if progress is not None:
        progress(Progress(0, len(planned), 0, 0.0))
    for done, (lo, hi) in enumerate(planned, 1):
        rows += _chunk(db, lo, hi)
        if progress is not None:
            progress(Progress(done, len(planned), rows, timer() - began))
    return rows


def _stored_span(db: Database) -> tuple[int, int]:
    """Where there is something to rebuild: from the later of the first sample stored and the first hour whose raw
    samples (and 1-minute rows) retention has not begun to remove, to the end of the last sample's hour."""
    t = schema.tier_state
    with db.session() as session:
        horizons = session.execute(sa.select(t.c.horizon_ms).where(t.c.tier.in_(["raw", "1m"]))).scalars()
        kept = max((h for h in horizons if h is not None), default=0)
        spans = [
            session.execute(sa.text(f"SELECT min(first_seen_ms), max(last_seen_ms) FROM {f.dimension}")).one()  # noqa: S608
            for f in FAMILIES
        ]
    first = min((s[0] for s in spans if s[0] is not None), default=0)
    last = max((s[1] for s in spans if s[1] is not None), default=0)
    return max(_ceil_hour(kept), first), _ceil_hour(last + schema.MINUTE_MS + 1)  # last_seen_ms lags a minute


def _ceil_hour(ms: int) -> int:
    return -(-ms // schema.HOUR_MS) * schema.HOUR_MS


def _chunk(db: Database, lo: int, hi: int) -> int:
    """One chunk in one transaction: its minutes, the hours it completes, its jobs' minutes, the positions."""
    dialect = db.dialect
    hours = range(lo - lo % schema.HOUR_MS, hi, schema.HOUR_MS)
    hours_done = [h for h in hours if h + schema.HOUR_MS <= hi]
    written = 0
    for family in FAMILIES:
        db.ensure_partitions(family.table("1m"), range(lo, hi, schema.MINUTE_MS))
        db.ensure_partitions(family.table("1h"), hours_done)
    with db.write_transaction() as conn:
        lock_tier(conn, "1m", exclusive=True)
        lock_tier(conn, "1h", exclusive=True)
        params = {"lo": lo, "hi": hi, "read_from": lo - COUNTER_LOOKBACK_MS, "g0": 0, "g1": ALL_IDS}
        for family in FAMILIES:
            table = family.table("1m")
            conn.execute(sa.text(_DELETE.format(table=table)), params)
            written += int(conn.execute(sa.text(from_samples_sql(dialect, family)), params).rowcount)
        if hours_done:
            params = {"lo": hours_done[0], "hi": hours_done[-1] + schema.HOUR_MS, "g0": 0, "g1": ALL_IDS}
            for family in FAMILIES:
                table = family.table("1h")
                conn.execute(sa.text(_DELETE.format(table=table)), params)
                written += int(conn.execute(sa.text(from_minutes_sql(dialect, family)), params).rowcount)
        jobminute.recompute(conn, dialect, range(lo, hi, schema.MINUTE_MS))
        _advance(conn, "1m", lo, hi)
        if hours_done:
            _advance(conn, "1h", hours_done[0], hours_done[-1] + schema.HOUR_MS)
    return written


def _advance(conn: Connection, tier: str, lo: int, hi: int) -> None:
    """Move the tier's position to ``hi`` where it stands in [lo, hi), or never ran and no sample precedes ``lo``."""
    t = schema.tier_state
    position = conn.execute(sa.select(t.c.position_ms).where(t.c.tier == tier)).scalar_one()
    if position is None:
        first = conn.execute(sa.select(sa.func.min(schema.gpu.c.first_seen_ms))).scalar_one()
        if first is not None and first < lo:
            return
    elif not lo <= position < hi:
        return
    conn.execute(sa.update(t).where(t.c.tier == tier).values(position_ms=hi))
