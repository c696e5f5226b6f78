"""Incremental 1-minute and 1-hour rollups (min/mean/max of gauges, increases of counters, OR of bitmasks).

The aggregate SQL itself comes from ``storage.aggregates``. Each tier keeps its position in ``tier_state``: every
bucket below it is rolled up, so a restarted process resumes where the last one stopped. Samples written below the
position (a replayed spool, a slow collector) leave a ``rollup_dirty`` mark and the next run recomputes their
buckets; rollup rows are upserted, so recomputing is safe.

Two ways to drive it, one transaction per piece of work, each holding the tier's lock (``db.lock_tier``) so that
writers of the tier's source queue behind it instead of slipping rows in unseen:

- ``step(now, max_seconds)``, for the collector between scrape rounds: one slice of one bucket per call, the
  slice sized from the previous step's cost per id to take ``AIM`` of ``max_seconds`` (``next_slice``), less what
  planning a new bucket took in the same step. A bucket is rolled up family by family (``fabricschema.FAMILIES``:
  GPUs, then RDMA ports, hosts and jobs' hosts), each slice by slice of its ids; the position moves when the last
  family's last slice is done. While a bucket is rolled up slice by slice, the row ``<tier>.pending`` of
  ``tier_state`` holds the bucket's end, and writers mark samples below it as late, as if the position were already
  there; readers still see the old position until the bucket is done.
- ``run(now)``: everything due, several buckets of all GPUs per transaction (catching up, tests, benchmarks).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpulens.storage import aggregates, schema
from gpulens.storage.db import Database, lock_tier
from gpulens.storage.fabricschema import FAMILIES, Family

log = logging.getLogger(__name__)

# A counter's increase in a bucket counts from the sample before the bucket's first; look this far back for it.
# Every read of a range reads this much more, so it is kept to twice a slow (60 s) scrape interval.
COUNTER_LOOKBACK_MS: Final = 2 * schema.MINUTE_MS
PENDING: Final = ".pending"  # tier_state row "<tier>.pending": the end of the bucket being rolled up slice by slice
ALL_IDS: Final = 2**31 - 1  # the end of the GPU id range of a slice that takes the rest


@dataclass(frozen=True, slots=True)
class _Tier:
    name: str
    table: str
    source: str
    width_ms: int
    chunk_buckets: int  # buckets per transaction in run()
    coarser: str | None  # the tier built from this one, told when old buckets are recomputed


_TIERS: Final = (
    _Tier("1m", "gpu_rollup_1m", "gpu_sample", schema.MINUTE_MS, 10, "1h"),
    _Tier("1h", "gpu_rollup_1h", "gpu_rollup_1m", schema.HOUR_MS, 1, None),
)


@dataclass(slots=True)
class _Work:
    """Buckets [lo, hi) of a tier, rolled up family by family (GPUs, then ports, hosts, jobs: ``FAMILIES``), each
    slice by slice of its ids (or all at once)."""

    tier: _Tier
    lo: int
    hi: int
    settled_id: int  # the tier's rollup_dirty marks up to this id are settled once the work is done
    next_gpu: int  # the first id of the next slice (of the family being rolled up)
    last_gpu: int  # the family's largest id when its turn started
    family: int = 0  # the position in FAMILIES of the family being rolled up
    done: bool = False


def _rollup_columns(family: Family) -> list[str]:
    return [family.key, "ts_ms", "n", "elapsed_ms", *aggregates.rollup_columns(family.fields)]


def _upsert_tail(columns: list[str]) -> str:
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns[2:])
    return f"ON CONFLICT ({columns[0]}, ts_ms) DO UPDATE SET {updates}"


def from_samples_sql(dialect: str, family: Family) -> str:
    """1-minute buckets of the family's ids [g0, g1) (GPUs, ports, ...) from raw samples.

    Gauges and bitmasks are aggregated straight off the rows of the range; counters' increases need each sample's
    predecessor (a window over a narrow projection: sorting wide rows for it measured twice as slow). SQLite reads
    the range one minute at a time along its primary key, seeking the GPU range within each minute, and groups by
    the stored minute. ``storage.rebuild`` runs the same statement over every id of a time chunk.
    """
    minute = schema.minute_of("ts_ms")  # of the window's rows (and of every row on PostgreSQL)
    stored = schema.MINUTE if dialect == "sqlite" else minute
    gauges: list[str] = []
    counters: list[str] = []
    key, samples = family.key, family.source(dialect)
    for f in family.fields:
        named = [
            f"{sql} AS {f.column}_{aggregate}"
            for sql, aggregate in zip(aggregates.summary(f, "raw", dialect), f.aggregates, strict=True)
        ]
        (counters if f.kind == "counter" else gauges).extend(named)
    inner = aggregates.window_columns(family.fields, counters_only=True, key=key)
    counted = [f for f in family.fields if f.kind == "counter"]  # the window reads no profile: no join for it
    gpus = f"{key} >= :g0 AND {key} < :g1"
    where, read_where = f"ts_ms >= :lo AND ts_ms < :hi AND {gpus}", f"ts_ms >= :read_from AND ts_ms < :hi AND {gpus}"
    cte = ""
    if dialect == "sqlite":
        cte = (
            f"WITH RECURSIVE minutes(m) AS (SELECT {schema.minute_of(':read_from')} "  # noqa: S608 (parameters)
            f"UNION ALL SELECT m + 1 FROM minutes WHERE m + 1 < {schema.minute_of('(:hi + 59999)')}) "
        )
        in_minutes = f" AND {stored} IN (SELECT m FROM minutes)"  # noqa: S608 (constant identifiers)
        where += in_minutes
        read_where += in_minutes
    aggregated = (
        f"SELECT {key}, {stored} AS minute, count(*) AS n, {', '.join(gauges)} "  # noqa: S608
        f"FROM {samples} WHERE {where} GROUP BY {stored}, {key}"
    )
    increases = (
        f"SELECT {key}, {minute} AS minute, {', '.join(['sum(dt) AS elapsed_ms', *counters])} "  # noqa: S608
        f"FROM (SELECT {', '.join(inner)} FROM {family.source(dialect, counted)} WHERE {read_where} "
        f"WINDOW w AS (PARTITION BY {key} ORDER BY ts_ms)) AS x "
        f"WHERE ts_ms >= :lo GROUP BY {key}, {minute}"
    )
    columns = _rollup_columns(family)
    values = [
        schema.minute_start("a.minute")
        if c == "ts_ms"
        else f"c.{c}"
        if c == "elapsed_ms" or c.endswith("_increase")
        else f"a.{c}"
        for c in columns
    ]
    return (
        f"INSERT INTO {family.table('1m')} ({', '.join(columns)}) {cte}"  # noqa: S608 (identifiers are constants)
        f"SELECT {', '.join(values)} FROM ({aggregated}) AS a LEFT JOIN ({increases}) AS c "
        f"ON c.{key} = a.{key} AND c.minute = a.minute WHERE true {_upsert_tail(columns)}"
    )


def from_minutes_sql(dialect: str, family: Family) -> str:
    """1-hour buckets of the family's ids [g0, g1) from 1-minute ones: means weighted by sample counts."""
    key = family.key
    outer = [f"r.{key}", f"(r.ts_ms / {schema.HOUR_MS}) * {schema.HOUR_MS}", "sum(r.n)", "sum(r.elapsed_ms)"]
    for f in family.fields:
        outer += aggregates.summary(f, "1m", dialect, prefix="r.")
    # The 1-minute table is clustered by id: drive the read id by id (SQLite's CROSS JOIN keeps this order).
    minutes = family.table("1m")
    join = f"{family.dimension} AS g " + (
        f"CROSS JOIN {minutes} AS r" if dialect == "sqlite" else f"JOIN {minutes} AS r ON true"
    )
    columns = _rollup_columns(family)
    return (
        f"INSERT INTO {family.table('1h')} ({', '.join(columns)}) "  # noqa: S608 (identifiers are constants)
        f"SELECT {', '.join(outer)} FROM {join} WHERE g.id >= :g0 AND g.id < :g1 "
        f"AND r.{key} = g.id AND r.ts_ms >= :lo AND r.ts_ms < :hi "
        f"GROUP BY r.{key}, (r.ts_ms / {schema.HOUR_MS}) {_upsert_tail(columns)}"
    )


AIM: Final = 0.4  # a step aims at this share of its budget: a busy machine may slow one down twice or more


def next_slice(size: int, elapsed: float, max_seconds: float, ids: int | None = None) -> int:
    """The next slice of ids, from the last step's: ``size`` asked, ``ids`` rolled (fewer when it took the rest),
    ``elapsed`` seconds. From the cost per id, the slice that takes ``AIM`` of ``max_seconds``: a step over that
    shrinks to it at once; one under it grows halfway there, at most by half, so one step sped up by chance does not
    make the next one long."""
    per_id = elapsed / max(ids or size, 1)
    fit = max_seconds * AIM / max(per_id, 1e-7)
    if elapsed > max_seconds * AIM:
        return max(1, int(fit))
    return max(1, min(math.ceil(size * 1.5), round((size + fit) / 2)))


class Rollups:
    """Builds the 1-minute and 1-hour tables incrementally: ``step`` between scrape rounds, or ``run``."""

    def __init__(
        self,
        db: Database,
        *,
        settle_s: float = 30.0,
        slice_gpus: int = 256,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        """``settle_s``: roll a minute up only this long after it ends, so most samples are in by then.

        ``slice_gpus``: the GPUs of the first slice ``step`` rolls up; later slices are sized by measured time
        (``timer``: seconds, monotonic).
        """
        self._db = db
        self._timer = timer
        self._settle_ms = round(settle_s * 1000)
        self._sql = {("1m", f.name): from_samples_sql(db.dialect, f) for f in FAMILIES} | {
            ("1h", f.name): from_minutes_sql(db.dialect, f) for f in FAMILIES
        }
        # An hour of a GPU is 60 minute rows to aggregate, a minute about 6 raw rows: start the hours smaller.
        self._slice = {
            (t, f.name): max(1, slice_gpus // (16 if t == "1h" else 1)) for t in ("1m", "1h") for f in FAMILIES
        }
        self._per_id: dict[tuple[str, str], float] = {}  # seconds per id of the last slice of each kind
        self._work: _Work | None = None
        self.longest_step_s = 0.0  # the longest step() so far, for the collector's metrics and the benchmark

    def run(self, now: float) -> int:
        """Roll up every complete bucket not yet rolled up, and recompute dirty ones. Returns rows written."""
        written = 0
        if self._work is not None:  # the rest of a bucket that step() left half done
            written += self._roll_all(self._work)
        for tier in _TIERS:
            while (work := self._plan(tier, round(now * 1000), sliced=False)) is not None:
                written += self._roll_all(work)
        return written

    def _roll_all(self, work: _Work) -> int:
        """Every family of the work, one transaction each; the last one finishes the work."""
        written = 0
        while not work.done:
            written += self._roll(work, ALL_IDS)
        return written

    def step(self, now: float, *, max_seconds: float = 0.05) -> bool:
        """Roll up one GPU slice of one bucket, sized to take about ``max_seconds``; True while more is pending.

        The collector calls it between scrape rounds, as long as it returns True and the next round is not due.
        A call with nothing to do costs a few small queries.
        """
        started = self._timer()
        now_ms = round(now * 1000)
        work = self._work
        if work is None:
            for tier in _TIERS:
                work = self._work = self._plan(tier, now_ms, sliced=True)
                if work is not None:
                    break
            if work is None:
                return False
        kind = (work.tier.name, FAMILIES[work.family].name)
        slice_gpus = self._slice[kind]
        planned = self._timer() - started
        if planned > 0 and (per_id := self._per_id.get(kind)):  # planning took part of this step's budget
            slice_gpus = max(1, min(slice_gpus, int((max_seconds * AIM - planned) / per_id)))
        first, last = work.next_gpu, work.last_gpu
        g1 = first + slice_gpus if first + slice_gpus <= last else ALL_IDS
        rolling = self._timer()
        self._roll(work, g1)
        now_s = self._timer()
        ids = min(g1, last + 1) - first
        self._per_id[kind] = (now_s - rolling) / max(ids, 1)
        self._slice[kind] = next_slice(self._slice[kind], now_s - rolling, max_seconds, ids)
        self.longest_step_s = max(self.longest_step_s, now_s - started)
        return True

    # --- planning -----------------------------------------------------------------------------------------------

    def _limit(self, conn: Connection, tier: _Tier, now_ms: int) -> int:
        """Buckets that start below the limit are complete."""
        if tier.name == "1m":
            end = now_ms - self._settle_ms
        else:
            t = schema.tier_state
            end = conn.execute(sa.select(t.c.position_ms).where(t.c.tier == "1m")).scalar_one() or 0
        return end - end % tier.width_ms

    def _plan(self, tier: _Tier, now_ms: int, *, sliced: bool) -> _Work | None:
        """The next buckets of ``tier`` to roll up (one when ``sliced``), or None when it is up to date."""
        with self._db.session() as session:
            conn = session.connection()
            limit = self._limit(conn, tier, now_ms)
            t, d = schema.tier_state, schema.rollup_dirty
            position = conn.execute(sa.select(t.c.position_ms).where(t.c.tier == tier.name)).scalar_one()
            dirty, settled_id = conn.execute(
                sa.select(sa.func.min(d.c.from_ms), sa.func.max(d.c.id)).where(d.c.tier == tier.name)
            ).one()
            if position is None:
                position = self._first_bucket(conn, tier)
                if position is None:
                    return None
            if dirty is not None:
                lo = min(position, dirty - dirty % tier.width_ms)
            elif tier.name == "1m":
                lo = self._next_sample_minute(conn, position, limit)  # skip a stretch without samples
            else:
                lo = position
            if lo >= limit:
                return None
            hi = min(limit, lo + tier.width_ms * (1 if sliced else tier.chunk_buckets))
            g = schema.gpu.c.id
            first_gpu, last_gpu = conn.execute(sa.select(sa.func.min(g), sa.func.max(g))).one()
        return _Work(tier, lo, hi, settled_id or 0, first_gpu or 0, last_gpu or 0)

    def _next_sample_minute(self, conn: Connection, lo: int, limit: int) -> int:
        """The minute of the first raw sample in [lo, limit), or limit if there is none."""
        if self._db.dialect == "sqlite":
            sql = (
                f"SELECT ts_ms FROM gpu_sample WHERE minute >= {schema.minute_of(':lo')} "  # noqa: S608 (parameters)
                f"AND minute < {schema.minute_of(':limit')} ORDER BY minute LIMIT 1"
            )
        else:
            # The BRIN index makes min() read every block range of [lo, limit): first look at lo's minute alone,
            # which has samples whenever the collector is running.
            in_first = (
                "SELECT ts_ms FROM gpu_sample WHERE ts_ms >= :lo AND ts_ms < :lo + 60000 AND ts_ms < :limit LIMIT 1"
            )
            if conn.execute(sa.text(in_first), {"lo": lo, "limit": limit}).scalar() is not None:
                return lo
            sql = "SELECT min(ts_ms) FROM gpu_sample WHERE ts_ms >= :lo AND ts_ms < :limit"
        first = conn.execute(sa.text(sql), {"lo": lo, "limit": limit}).scalar()
        return limit if first is None else max(lo, first - first % schema.MINUTE_MS)

    @staticmethod
    def _first_bucket(conn: Connection, tier: _Tier) -> int | None:
        """Where a tier that never ran starts: the bucket of the first sample ever stored."""
        first = conn.execute(sa.select(sa.func.min(schema.gpu.c.first_seen_ms))).scalar_one()
        return None if first is None else first - first % tier.width_ms

    # --- rolling up ---------------------------------------------------------------------------------------------

    def _roll(self, work: _Work, g1: int) -> int:
        """Roll up the ids [work.next_gpu, g1) of the work's family and buckets in one transaction; then go on to the
        next family, or finish the work after the last."""
        tier = work.tier
        family = FAMILIES[work.family]
        last_family = work.family == len(FAMILIES) - 1
        done = g1 > work.last_gpu and last_family
        with self._db.write_transaction() as conn:
            lock_tier(conn, tier.name, exclusive=True)
            if not done:
                self._set_pending(conn, tier.name, work.hi)
            self._db.ensure_partitions(family.table(tier.name), range(work.lo, work.hi, tier.width_ms))
            params = {
                "lo": work.lo,
                "hi": work.hi,
                "read_from": work.lo - COUNTER_LOOKBACK_MS,
                "g0": work.next_gpu,
                "g1": g1,
            }
            rows = int(conn.execute(sa.text(self._sql[(tier.name, family.name)]), params).rowcount)
            if done:
                self._advance(conn, work)
            elif g1 > work.last_gpu:  # the family is done: the next one's ids
                work.family += 1
                dimension = FAMILIES[work.family].dimension
                first, last = conn.exec_driver_sql(f"SELECT min(id), max(id) FROM {dimension}").one()  # noqa: S608
                g1, work.last_gpu = first or 0, last or 0
        log.debug(
            "rollup %s %s: %d rows for [%d, %d), ids below %d", tier.name, family.name, rows, work.lo, work.hi, g1
        )
        work.next_gpu = g1
        work.done = done
        if done and self._work is work:
            self._work = None
        return rows

    @staticmethod
    def _set_pending(conn: Connection, tier: str, hi: int | None) -> None:
        t = schema.tier_state
        conn.execute(sa.delete(t).where(t.c.tier == tier + PENDING))
        if hi is not None:
            conn.execute(sa.insert(t).values(tier=tier + PENDING, position_ms=hi))

    @classmethod
    def _advance(cls, conn: Connection, work: _Work) -> None:
        """Move the position past the work; keep a dirty mark for what is left to recompute below the position.

        Marks written while the work went on (their ids are above ``settled_id``) stay: their buckets are recomputed.
        """
        tier = work.tier
        t, d = schema.tier_state, schema.rollup_dirty
        position = conn.execute(sa.select(t.c.position_ms).where(t.c.tier == tier.name)).scalar_one() or work.hi
        conn.execute(sa.delete(d).where(d.c.tier == tier.name, d.c.id <= work.settled_id))
        if work.hi < position:
            conn.execute(sa.insert(d).values(tier=tier.name, from_ms=work.hi))
        conn.execute(sa.update(t).where(t.c.tier == tier.name).values(position_ms=max(position, work.hi)))
        cls._set_pending(conn, tier.name, None)
        if tier.coarser is None:
            return
        coarser = conn.execute(
            sa.select(sa.func.max(t.c.position_ms)).where(t.c.tier.in_([tier.coarser, tier.coarser + PENDING]))
        ).scalar_one()
        if coarser is not None and work.lo < coarser:
            lock_tier(conn, tier.coarser, exclusive=False)
            conn.execute(sa.insert(d).values(tier=tier.coarser, from_ms=work.lo))
