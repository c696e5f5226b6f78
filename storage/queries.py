"""The only read path for the dashboard, the alert rules and ``gpulens query``.

Every function takes a ``Database`` and returns ``gpulens.model`` records or the frozen dataclasses defined here, in
SI units, never ORM objects or rows.

Time series come from one of three tiers: raw samples, 1-minute or 1-hour rollups. ``series`` picks the coarsest tier
that still gives about ``max_points`` points over the range (and one that retention has not emptied), takes what the
rollups have not reached yet from the finer tiers, and merges it all into buckets of one step. Counters (fields ending
in ``_total``) come back as per-second rates: each increase counts from the sample before, and a counter that went
down (an exporter restart) counts from zero.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.orm import Session

from gpulens.model import GpuJob, GpuReading, ProcessReading, TargetHealth
from storage import schema
from storage.db import Database
from storage.rollup import COUNTER_LOOKBACK_MS

IDLE_UTILIZATION: Final = 0.05  # a GPU below this utilization is idle
JOB_POINTS: Final = 24  # jobs() reads the coarsest tier that gives about this many buckets over its range
KNOWN_WITHIN_S: Final = 7 * 86_400.0  # cluster_summary counts GPUs seen this recently as part of the cluster
_TIER_WIDTH_MS: Final = {"raw": 1000, "1m": schema.MINUTE_MS, "1h": schema.HOUR_MS}
_TIER_TABLE: Final = {"raw": "gpu_sample", "1m": "gpu_rollup_1m", "1h": "gpu_rollup_1h"}


@dataclass(frozen=True, slots=True)
class SeriesData:
    """One GPU's series: per bucket, the mean (gauges), rate per second (counters) or OR (bitmasks) of each field."""

    uuid: str
    resolution: str  # the tier most of the range came from: "raw" | "1m" | "1h"
    step_seconds: float
    timestamps: tuple[float, ...]  # bucket start times; buckets without data are left out
    values: Mapping[str, tuple[float | None, ...]]
    minimum: Mapping[str, tuple[float | None, ...]]  # for counters and bitmasks, the same as values
    maximum: Mapping[str, tuple[float | None, ...]]


@dataclass(frozen=True, slots=True)
class JobSummary:
    """A job over a time range: GPU-hours and utilization within the range; first and last seen overall."""

    job_id: str
    user: str | None
    gpus: tuple[str, ...]  # GPU UUIDs
    nodes: tuple[str, ...]
    first_seen: float
    last_seen: float
    gpu_hours: float
    utilization_mean: float | None
    utilization_stddev: float | None  # over every sample of every GPU; from rollups, over bucket means
    memory_used_mean_bytes: float | None
    memory_used_max_bytes: int | None
    resolution: str


@dataclass(frozen=True, slots=True)
class ClusterSummary:
    timestamp: float
    gpus_total: int  # seen within the last week
    gpus_reporting: int  # with a reading newer than max_age_s
    gpus_up: int
    gpus_busy: int
    gpus_idle: int
    gpus_allocated_idle: int  # idle while a job holds them
    utilization_mean: float | None
    memory_used_bytes: int
    memory_total_bytes: int
    power_watts: float
    nodes_total: int
    nodes_reporting: int


@dataclass(frozen=True, slots=True)
class GpuInfo:
    node: str
    gpu: int
    uuid: str
    model: str
    pci_bus_id: str | None
    driver_version: str | None
    mig_enabled: bool | None
    first_seen: float
    last_seen: float


@dataclass(frozen=True, slots=True)
class LinkOutage:
    """An NVLink reported inactive from ``since`` to ``until`` (None while it still is)."""

    node: str
    gpu: int
    uuid: str
    link: int
    since: float
    until: float | None
    remote_pci_bus_id: str | None


# --- latest --------------------------------------------------------------------------------------------------------


def _reading_columns(dialect: str) -> tuple[str, list[int], int]:
    """The SELECT list of a GpuReading in field order, decoded to SI units by the database.

    Returns the list, the positions of boolean fields (the database returns 0/1) and of the XID JSON.
    """
    static = {
        "node": "g.node",
        "gpu": "g.gpu_index",
        "uuid": "g.uuid",
        "model": "g.model",
        "timestamp": f"CAST(s.ts_ms AS {_real(dialect)}) / 1000",
        "pci_bus_id": "g.pci_bus_id",
        "driver_version": "g.driver_version",
        "mig_enabled": "g.mig_enabled",
        "xid_errors": "s.xid_errors",
    }
    columns: list[str] = []
    booleans: list[int] = []
    for i, f in enumerate(dataclasses.fields(GpuReading)):
        stored = schema.FIELD_BY_NAME.get(f.name)
        if stored is None:
            columns.append(static[f.name])
        else:
            columns.append(stored.sql_decode(f"s.{f.name}", dialect))
        if str(f.type) in ("bool", "bool | None"):
            booleans.append(i)
    return ", ".join(columns), booleans, len(columns) - 1


def _real(dialect: str) -> str:
    return "DOUBLE PRECISION" if dialect == "postgresql" else "REAL"


def _latest_sql(dialect: str, max_age: bool) -> str:
    columns = _reading_columns(dialect)[0]
    fresh = "WHERE g.last_seen_ms >= :cutoff - 60000" if max_age else ""
    if dialect == "postgresql":
        return (
            f"SELECT {columns} FROM gpu AS g CROSS JOIN LATERAL "  # noqa: S608 (constant identifiers)
            "(SELECT * FROM gpu_sample AS x WHERE x.gpu_id = g.id AND x.ts_ms >= g.last_seen_ms "
            f"AND x.ts_ms < g.last_seen_ms + 60000 ORDER BY x.ts_ms DESC LIMIT 1) AS s {fresh}"
        )
    return (
        # MATERIALIZED and CROSS JOIN keep SQLite's plan: one index seek per GPU, then one row fetch.
        "WITH latest AS MATERIALIZED (SELECT g.id AS gpu_id, (SELECT max(x.ts_ms) FROM gpu_sample AS x "  # noqa: S608
        "WHERE x.gpu_id = g.id AND x.ts_ms / 60000 IN (g.last_seen_ms / 60000, g.last_seen_ms / 60000 + 1) "
        f"AND x.ts_ms >= g.last_seen_ms) AS ts_ms FROM gpu AS g {fresh}) "
        f"SELECT {columns} FROM latest AS l CROSS JOIN gpu AS g CROSS JOIN gpu_sample AS s "
        "WHERE g.id = l.gpu_id AND s.ts_ms / 60000 = l.ts_ms / 60000 AND s.gpu_id = l.gpu_id AND s.ts_ms = l.ts_ms"
    )


def _reading(row: Sequence[Any], booleans: Sequence[int], xids: int) -> GpuReading:
    values = list(row)
    for i in booleans:
        if values[i] is not None:
            values[i] = bool(values[i])
    text = values[xids]
    values[xids] = {int(k): int(v) for k, v in json.loads(text).items()} if text else {}
    return GpuReading(*values)


def latest_readings(db: Database, *, max_age_s: float | None = None) -> list[GpuReading]:
    """The newest reading of every GPU (only those newer than ``max_age_s``, if given), by node and index."""
    params = {"cutoff": round((db.clock.now() - max_age_s) * 1000)} if max_age_s is not None else {}
    _, booleans, xids = _reading_columns(db.dialect)
    with db.session() as session:
        rows = session.execute(sa.text(_latest_sql(db.dialect, max_age_s is not None)), params).all()
    readings = [_reading(row, booleans, xids) for row in rows]
    if max_age_s is not None:
        cutoff = db.clock.now() - max_age_s
        readings = [r for r in readings if r.timestamp >= cutoff]
    return sorted(readings, key=lambda r: (r.node, r.gpu))


def latest_snapshot_parts(db: Database) -> tuple[list[GpuJob], list[ProcessReading]]:
    """The jobs holding each GPU now and the processes of each GPU's latest reading."""
    a, g, p = schema.job_allocation, schema.gpu, schema.process_latest
    with db.session() as session:
        job_rows = session.execute(
            sa.select(g.c.node, g.c.gpu_index, g.c.uuid, a.c.job_id, a.c.user_name)
            .join(a, a.c.gpu_id == g.c.id)
            .where(a.c.end_ms.is_(None))
            .order_by(g.c.node, g.c.gpu_index, a.c.job_id)
        ).all()
        process_rows = session.execute(
            sa.select(g.c.node, g.c.gpu_index, g.c.uuid, p.c.pid, p.c.used_memory_bytes, p.c.command)
            .add_columns(p.c.user_name, p.c.job_id)
            .join(p, p.c.gpu_id == g.c.id)
            .order_by(g.c.node, g.c.gpu_index, p.c.pid)
        ).all()
    jobs = [GpuJob(*row) for row in job_rows]
    processes = [ProcessReading(*row) for row in process_rows]
    return jobs, processes


# --- tiers and segments --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Segment:
    tier: str
    lo_ms: int
    hi_ms: int  # exclusive


def _tier_state(session: Session) -> dict[str, tuple[int | None, int | None]]:
    t = schema.tier_state
    return {row.tier: (row.position_ms, row.horizon_ms) for row in session.execute(sa.select(t))}


def _plan(
    state: Mapping[str, tuple[int | None, int | None]], start_ms: int, end_ms: int, step_ms: float
) -> list[_Segment]:
    """Which tier serves which part of [start, end]: the chosen tier up to its rollup position, finer ones after."""
    tiers = ["raw", "1m", "1h"]
    chosen = max((i for i, tier in enumerate(tiers) if _TIER_WIDTH_MS[tier] <= 2 * step_ms), default=0)
    while chosen < 2 and (horizon := state.get(tiers[chosen], (None, None))[1]) is not None and start_ms < horizon:
        chosen += 1  # retention has emptied the start of the range in this tier
    segments: list[_Segment] = []
    lo = start_ms
    for i in range(chosen, -1, -1):
        position = state.get(tiers[i], (None, None))[0] if i > 0 else None
        hi = end_ms + 1 if i == 0 else min(end_ms + 1, position if position is not None else lo)
        if hi > lo:
            segments.append(_Segment(tiers[i], lo, hi))
            lo = hi
    return segments


def _step_ms(start_ms: int, end_ms: int, max_points: int, width_ms: int) -> int:
    """A bucket width, a whole number of tier widths, that gives at most max_points epoch-aligned buckets."""
    raw_step = (end_ms - start_ms) / (max_points - 1)
    return max(width_ms, math.ceil(raw_step / width_ms) * width_ms)


def _minutes_cte(dialect: str, read_from: str, hi: str) -> tuple[str, str]:
    """SQLite reads a time range of raw samples one minute at a time through its minute-leading index."""
    if dialect != "sqlite":
        return "", ""
    cte = (
        "WITH RECURSIVE minutes(m) AS "  # noqa: S608 (read_from and hi are parameter names)
        f"(SELECT {read_from} / 60000 UNION ALL SELECT m + 1 FROM minutes WHERE m < {hi} / 60000) "
    )
    return cte, "AND ts_ms / 60000 IN (SELECT m FROM minutes)"


def _partials(tier: str, fields: Sequence[schema.StoredField]) -> list[str]:
    """Per field, the partial aggregates that merge across tiers: gauges count, sum, min, max; counters increase and
    elapsed milliseconds; bitmasks an OR. Column p{j}_{k} is part k of field j."""
    out: list[str] = []
    for j, f in enumerate(fields):
        name = f.name
        if tier == "raw":
            if f.kind == "gauge":
                parts = [f"count({name})", f"sum({name})", f"min({name})", f"max({name})"]
            elif f.kind == "counter":
                parts = [
                    f"sum(CASE WHEN d_{name} < 0 THEN {name} ELSE d_{name} END)",
                    f"sum(CASE WHEN d_{name} IS NOT NULL THEN dt END)",
                ]
            else:
                parts = [f"bit_or({name})"]
        elif f.kind == "gauge":
            weight = f"CASE WHEN {name}_avg IS NOT NULL THEN n END"
            parts = [f"sum({weight})", f"sum({name}_avg * n)", f"min({name}_min)", f"max({name}_max)"]
        elif f.kind == "counter":
            parts = [f"sum({name}_inc)", f"sum(CASE WHEN {name}_inc IS NOT NULL THEN elapsed_ms END)"]
        else:
            parts = [f"bit_or({name}_or)"]
        out += [f"{part} AS p{j}_{k}" for k, part in enumerate(parts)]
    return out


def _segment_sql(tier: str, fields: Sequence[schema.StoredField], i: int, minutes: str) -> str:
    """Per GPU and bucket (ts_ms / :step), the partial aggregates of ``fields`` over [lo_i, hi_i) of one tier."""
    partials = ", ".join(_partials(tier, fields))
    if tier != "raw":
        return (
            f"SELECT gpu_id, ts_ms / :step AS b, {partials} FROM {_TIER_TABLE[tier]} "  # noqa: S608
            f"WHERE gpu_id IN :ids AND ts_ms >= :lo_{i} AND ts_ms < :hi_{i} GROUP BY gpu_id, ts_ms / :step"
        )
    inner = ["gpu_id", "ts_ms", "ts_ms - LAG(ts_ms) OVER w AS dt"]
    for f in fields:
        inner.append(f.name)
        if f.kind == "counter":
            inner.append(f"{f.name} - LAG({f.name}) OVER w AS d_{f.name}")
    return (
        f"SELECT gpu_id, ts_ms / :step AS b, {partials} FROM (SELECT {', '.join(inner)} "  # noqa: S608
        f"FROM gpu_sample WHERE gpu_id IN :ids AND ts_ms >= :read_from_{i} AND ts_ms < :hi_{i} {minutes} "
        f"WINDOW w AS (PARTITION BY gpu_id ORDER BY ts_ms)) AS x WHERE ts_ms >= :lo_{i} GROUP BY gpu_id, ts_ms / :step"
    )


def _series_sql(dialect: str, plan: Sequence[_Segment], fields: Sequence[schema.StoredField]) -> str:
    """All segments' partial aggregates, merged per GPU and bucket into means, rates and ORs in stored units."""
    cte, minutes = "", ""
    for i, segment in enumerate(plan):
        if segment.tier == "raw":
            cte, minutes = _minutes_cte(dialect, f":read_from_{i}", f":hi_{i}")
    union = " UNION ALL ".join(_segment_sql(seg.tier, fields, i, minutes) for i, seg in enumerate(plan))
    real = _real(dialect)
    finals: list[str] = []
    for j, f in enumerate(fields):
        if f.kind == "gauge":
            finals += [
                f"CASE WHEN sum(p{j}_0) > 0 THEN CAST(sum(p{j}_1) AS {real}) / sum(p{j}_0) END",
                f"min(p{j}_2)",
                f"max(p{j}_3)",
            ]
        elif f.kind == "counter":
            finals.append(f"CASE WHEN sum(p{j}_1) > 0 THEN CAST(sum(p{j}_0) AS {real}) * 1000 / sum(p{j}_1) END")
        else:
            finals.append(f"bit_or(p{j}_0)")
    return (
        f"{cte}SELECT gpu_id, b, {', '.join(finals)} FROM ({union}) AS u "  # noqa: S608 (constant identifiers)
        "GROUP BY gpu_id, b ORDER BY gpu_id, b"
    )


def _fields(names: Sequence[str]) -> list[schema.StoredField]:
    unknown = [name for name in names if name not in schema.FIELD_BY_NAME]
    if unknown:
        raise ValueError(f"unknown fields {', '.join(unknown)}; known: {', '.join(schema.FIELD_BY_NAME)}")
    return [schema.FIELD_BY_NAME[name] for name in names]


def _gpu_ids(session: Session, uuids: Iterable[str]) -> dict[int, str]:
    g = schema.gpu
    rows = session.execute(sa.select(g.c.id, g.c.uuid).where(g.c.uuid.in_(list(uuids)))).all()
    return {row.id: row.uuid for row in rows}


def series(
    db: Database,
    uuids: Sequence[str],
    fields: Sequence[str],
    start: float,
    end: float,
    max_points: int = 1000,
) -> dict[str, SeriesData]:
    """Time series of ``fields`` for the GPUs ``uuids`` over [start, end], at most ``max_points`` per GPU.

    Unknown UUIDs are left out of the result; an unknown field raises ``ValueError``.
    """
    if max_points < 2:
        raise ValueError("max_points must be at least 2")
    if end < start:
        raise ValueError("end is before start")
    stored = _fields(fields)
    start_ms, end_ms = round(start * 1000), round(end * 1000)
    with db.session() as session:
        ids = _gpu_ids(session, uuids)
        plan = _plan(_tier_state(session), start_ms, end_ms, (end_ms - start_ms) / (max_points - 1))
        step = _step_ms(start_ms, end_ms, max_points, _TIER_WIDTH_MS[plan[0].tier])
        rows: Sequence[Sequence[Any]] = []
        if ids and stored:
            params: dict[str, Any] = {"ids": list(ids), "step": step}
            for i, segment in enumerate(plan):
                params |= {f"lo_{i}": segment.lo_ms, f"hi_{i}": segment.hi_ms}
                params[f"read_from_{i}"] = segment.lo_ms - COUNTER_LOOKBACK_MS
            sql = sa.text(_series_sql(db.dialect, plan, stored)).bindparams(sa.bindparam("ids", expanding=True))
            rows = session.execute(sql, params).all()
    by_gpu: dict[int, list[Sequence[Any]]] = {gpu_id: [] for gpu_id in ids}
    for row in rows:
        by_gpu[row[0]].append(row)
    return {uuid: _series_data(uuid, by_gpu[gpu_id], stored, step, plan[0].tier) for gpu_id, uuid in ids.items()}


def _si(f: schema.StoredField, values: Iterable[Any]) -> tuple[float | None, ...]:
    return tuple(None if v is None else f.to_si(v) for v in values)


def _series_data(
    uuid: str, rows: Sequence[Sequence[Any]], fields: Sequence[schema.StoredField], step: int, resolution: str
) -> SeriesData:
    values: dict[str, tuple[float | None, ...]] = {}
    minimum: dict[str, tuple[float | None, ...]] = {}
    maximum: dict[str, tuple[float | None, ...]] = {}
    column = 2
    for f in fields:
        if f.kind == "gauge":
            values[f.name] = _si(f, (row[column] for row in rows))
            minimum[f.name] = _si(f, (row[column + 1] for row in rows))
            maximum[f.name] = _si(f, (row[column + 2] for row in rows))
            column += 3
        else:  # a rate or an OR: one value per bucket
            values[f.name] = minimum[f.name] = maximum[f.name] = _si(f, (row[column] for row in rows))
            column += 1
    return SeriesData(
        uuid=uuid,
        resolution=resolution,
        step_seconds=step / 1000,
        timestamps=tuple(row[1] * step / 1000 for row in rows),
        values=values,
        minimum=minimum,
        maximum=maximum,
    )


# --- jobs ----------------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _JobStats:
    util_n: float = 0.0
    util_sum: float = 0.0
    util_sq: float = 0.0
    mem_n: float = 0.0
    mem_sum: float = 0.0
    mem_max: float | None = None

    def add(self, values: Sequence[Any]) -> None:
        util_n, util_sum, util_sq, mem_n, mem_sum, mem_max = values
        if util_n:
            self.util_n += float(util_n)
            self.util_sum += float(util_sum)
            self.util_sq += float(util_sq)
        if mem_n:
            self.mem_n += float(mem_n)
            self.mem_sum += float(mem_sum)
            self.mem_max = float(mem_max) if self.mem_max is None else max(self.mem_max, float(mem_max))


def _job_stats_sql(dialect: str, tier: str) -> str:
    """Per allocation: utilization count/sum/sum of squares and memory count/sum/max within its window of [lo, hi)."""
    if tier == "raw":
        stats = (
            "count(s.utilization_ratio), sum(s.utilization_ratio), "
            "sum(s.utilization_ratio * 1.0 * s.utilization_ratio), "  # * 1.0: a smallint square overflows on PostgreSQL
            "count(s.memory_used_bytes), sum(s.memory_used_bytes), max(s.memory_used_bytes)"
        )
    else:
        stats = (
            "sum(CASE WHEN s.utilization_ratio_avg IS NOT NULL THEN s.n END), sum(s.utilization_ratio_avg * s.n), "
            "sum(s.utilization_ratio_avg * s.utilization_ratio_avg * s.n), "
            "sum(CASE WHEN s.memory_used_bytes_avg IS NOT NULL THEN s.n END), "
            "sum(s.memory_used_bytes_avg * s.n), max(s.memory_used_bytes_max)"
        )
    cte, minutes = _minutes_cte(dialect, ":lo", ":hi") if tier == "raw" else ("", "")
    return (
        f"{cte}SELECT a.id, {stats} FROM job_allocation AS a JOIN {_TIER_TABLE[tier]} AS s "  # noqa: S608
        "ON s.gpu_id = a.gpu_id AND s.ts_ms >= CASE WHEN a.start_ms > :lo THEN a.start_ms ELSE :lo END "
        "AND s.ts_ms < CASE WHEN a.end_ms IS NOT NULL AND a.end_ms < :hi THEN a.end_ms + 1 ELSE :hi END "
        f"WHERE a.id IN :alloc {minutes.replace('ts_ms', 's.ts_ms')} GROUP BY a.id"
    )


def jobs(db: Database, start: float, end: float, *, job_id: str | None = None) -> list[JobSummary]:
    """Every job (or only ``job_id``) that held a GPU during [start, end], most GPU-hours first."""
    start_ms, end_ms = round(start * 1000), round(end * 1000)
    a, g = schema.job_allocation, schema.gpu
    effective_end = sa.func.coalesce(a.c.end_ms, schema.newest_sample_ms(db.dialect), a.c.start_ms).label("end_ms")
    with db.session() as session:
        allocations = session.execute(
            sa.select(a.c.id, a.c.job_id, a.c.user_name, a.c.start_ms, effective_end, g.c.uuid, g.c.node)
            .join(g, g.c.id == a.c.gpu_id)
            .where(a.c.start_ms <= end_ms, sa.or_(a.c.end_ms.is_(None), a.c.end_ms >= start_ms))
            .where(sa.true() if job_id is None else a.c.job_id == job_id)
        ).all()
        allocations = [row for row in allocations if row.end_ms >= start_ms]
        if not allocations:
            return []
        plan = _plan(_tier_state(session), start_ms, end_ms, (end_ms - start_ms) / JOB_POINTS)
        stats: dict[int, _JobStats] = defaultdict(_JobStats)
        for segment in plan:
            sql = sa.text(_job_stats_sql(db.dialect, segment.tier)).bindparams(sa.bindparam("alloc", expanding=True))
            params = {
                "alloc": [row.id for row in allocations],
                "lo": segment.lo_ms,
                "hi": segment.hi_ms,
            }
            for row in session.execute(sql, params):
                stats[row[0]].add(row[1:])
    return _job_summaries(allocations, stats, start_ms, end_ms, plan[0].tier)


def _job_summaries(
    allocations: Sequence[Any], stats: Mapping[int, _JobStats], start_ms: int, end_ms: int, resolution: str
) -> list[JobSummary]:
    by_job: dict[str, list[Any]] = defaultdict(list)
    for row in allocations:
        by_job[row.job_id].append(row)
    ratio = schema.FIELD_BY_NAME["utilization_ratio"]
    memory = schema.FIELD_BY_NAME["memory_used_bytes"]
    out: list[JobSummary] = []
    for job_id, rows in by_job.items():
        total = _JobStats()
        for row in rows:
            part = stats.get(row.id)
            if part is not None:
                total.add((part.util_n, part.util_sum, part.util_sq, part.mem_n, part.mem_sum, part.mem_max))
        gpu_ms = sum(max(0, min(row.end_ms, end_ms) - max(row.start_ms, start_ms)) for row in rows)
        mean = total.util_sum / total.util_n if total.util_n else None
        stddev = math.sqrt(max(0.0, total.util_sq / total.util_n - mean * mean)) if mean is not None else None
        out.append(
            JobSummary(
                job_id=job_id,
                user=next((row.user_name for row in rows if row.user_name is not None), None),
                gpus=tuple(sorted({row.uuid for row in rows})),
                nodes=tuple(sorted({row.node for row in rows})),
                first_seen=min(row.start_ms for row in rows) / 1000,
                last_seen=max(row.end_ms for row in rows) / 1000,
                gpu_hours=gpu_ms / schema.HOUR_MS,
                utilization_mean=None if mean is None else ratio.to_si(mean),
                utilization_stddev=None if stddev is None else ratio.to_si(stddev),
                memory_used_mean_bytes=memory.to_si(total.mem_sum / total.mem_n) if total.mem_n else None,
                memory_used_max_bytes=None if total.mem_max is None else round(memory.to_si(total.mem_max)),
                resolution=resolution,
            )
        )
    return sorted(out, key=lambda job: (-job.gpu_hours, job.job_id))


# --- summaries -----------------------------------------------------------------------------------------------------


def cluster_summary(db: Database, *, max_age_s: float, known_within_s: float = KNOWN_WITHIN_S) -> ClusterSummary:
    """The cluster now: GPUs reporting, up, busy, idle and idle while allocated; utilization, memory, power."""
    now = db.clock.now()
    g, a = schema.gpu, schema.job_allocation
    with db.session() as session:
        known = session.execute(
            sa.select(g.c.uuid, g.c.node).where(g.c.last_seen_ms >= round((now - known_within_s) * 1000))
        ).all()
        allocated = set(
            session.execute(
                sa.select(g.c.uuid).join(a, a.c.gpu_id == g.c.id).where(a.c.end_ms.is_(None)).distinct()
            ).scalars()
        )
    readings = latest_readings(db, max_age_s=max_age_s)
    up = [r for r in readings if r.up]
    utilizations = [r.utilization_ratio for r in up if r.utilization_ratio is not None]
    idle = [r for r in up if r.utilization_ratio is not None and r.utilization_ratio < IDLE_UTILIZATION]
    return ClusterSummary(
        timestamp=now,
        gpus_total=len({row.uuid for row in known} | {r.uuid for r in readings}),
        gpus_reporting=len(readings),
        gpus_up=len(up),
        gpus_busy=len(utilizations) - len(idle),
        gpus_idle=len(idle),
        gpus_allocated_idle=sum(1 for r in idle if r.uuid in allocated),
        utilization_mean=sum(utilizations) / len(utilizations) if utilizations else None,
        memory_used_bytes=sum(r.memory_used_bytes or 0 for r in up),
        memory_total_bytes=sum(r.memory_total_bytes or 0 for r in up),
        power_watts=sum(r.power_watts or 0.0 for r in readings),
        nodes_total=len({row.node for row in known} | {r.node for r in readings}),
        nodes_reporting=len({r.node for r in readings}),
    )


def target_health(db: Database) -> list[TargetHealth]:
    """The latest health of every target, by name."""
    t = schema.target_health
    with db.session() as session:
        rows = session.execute(sa.select(t).order_by(t.c.target)).all()
    return [
        TargetHealth(
            target=row.target,
            url=row.url,
            kind=row.kind,
            timestamp=row.at,
            up=bool(row.up),
            node=row.node,
            scrape_duration_seconds=row.scrape_duration_seconds,
            samples=row.samples,
            rejected=row.rejected,
            last_error=row.last_error,
        )
        for row in rows
    ]


def gpu_info(db: Database) -> list[GpuInfo]:
    """Static info of every GPU ever stored (until retention removes it), by node and index."""
    g = schema.gpu
    with db.session() as session:
        rows = session.execute(sa.select(g).order_by(g.c.node, g.c.gpu_index)).all()
    return [
        GpuInfo(
            node=row.node,
            gpu=row.gpu_index,
            uuid=row.uuid,
            model=row.model,
            pci_bus_id=row.pci_bus_id,
            driver_version=row.driver_version,
            mig_enabled=row.mig_enabled,
            first_seen=row.first_seen_ms / 1000,
            last_seen=row.last_seen_ms / 1000,
        )
        for row in rows
    ]


def link_outages(db: Database, start: float, end: float) -> list[LinkOutage]:
    """NVLinks reported inactive at some time in [start, end]."""
    n, g = schema.nvlink_down, schema.gpu
    start_ms, end_ms = round(start * 1000), round(end * 1000)
    with db.session() as session:
        rows = session.execute(
            sa.select(g.c.node, g.c.gpu_index, g.c.uuid, n.c.link, n.c.start_ms, n.c.end_ms, n.c.remote_pci_bus_id)
            .join(n, n.c.gpu_id == g.c.id)
            .where(n.c.start_ms <= end_ms, sa.or_(n.c.end_ms.is_(None), n.c.end_ms >= start_ms))
            .order_by(g.c.node, g.c.gpu_index, n.c.link, n.c.start_ms)
        ).all()
    return [
        LinkOutage(
            node=row.node,
            gpu=row.gpu_index,
            uuid=row.uuid,
            link=row.link,
            since=row.start_ms / 1000,
            until=None if row.end_ms is None else row.end_ms / 1000,
            remote_pci_bus_id=row.remote_pci_bus_id,
        )
        for row in rows
    ]


__all__ = [
    "ClusterSummary",
    "GpuInfo",
    "JobSummary",
    "LinkOutage",
    "SeriesData",
    "cluster_summary",
    "gpu_info",
    "jobs",
    "latest_readings",
    "latest_snapshot_parts",
    "link_outages",
    "series",
    "target_health",
]
