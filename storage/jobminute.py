"""The per-job minute aggregate: one narrow row per (minute, job) that the writer keeps current in each round.

``job_minute`` holds, for every minute a job held GPUs, what the jobs and job pages show of it (``storage.jobstats``):
utilization's sample count, sum and sum of squares, and memory used's sample count, sum and maximum, in stored units
(1/10,000 and KiB, as ``gpu_sample``). A sample counts for every job its snapshot lists on its GPU (jobs and processes
alike, as the writer's job allocations do), so a job on many nodes sums its GPUs of every node, and a 1-hour read of
the jobs page reads one row per job and minute, not one per GPU and sample.

The writer adds each round's new samples (``increments``, then ``upsert`` in the round's transaction). Only a reading
newer than its GPU's newest stored one is added: one written again, or replayed late, is not. The newest stored again
(an exporter serving the same snapshot) changes nothing; the minutes of older ones are computed again from the raw
samples and the job allocations (``recompute``), so that nothing is counted twice and a late sample still counts.
``tier_state`` row ``job``: ``horizon_ms`` is the first minute the table covers (minutes before it, from before the
upgrade to revision 0009 or past retention, are read from the rollups by ``gpulens.storage.jobstats``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from operator import attrgetter, mul
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpulens.model import GpuReading, NodeSnapshot
from gpulens.storage import schema

TIER: Final = "job"  # its tier_state row: horizon_ms is the first minute the table covers
_UTILIZATION: Final = schema.FIELD_BY_NAME["utilization_ratio"]
_MEMORY: Final = schema.FIELD_BY_NAME["memory_used_bytes"]
_UTIL_SCALE: Final = _UTILIZATION.per_unit / _UTILIZATION.unit
_MEMORY_SCALE: Final = _MEMORY.per_unit / _MEMORY.unit
# The aggregate columns, in row order after job_id and ts_ms.
COLUMNS: Final = ("util_n", "util_sum", "util_sq", "memory_n", "memory_sum", "memory_max")

job_minute: Final = sa.Table(
    "job_minute",
    schema.metadata,
    sa.Column("ts_ms", sa.BigInteger, primary_key=True),  # the minute's start
    sa.Column("job_id", sa.Text, primary_key=True),
    sa.Column("util_n", sa.Integer, nullable=False),  # samples with a utilization
    sa.Column("util_sum", sa.BigInteger, nullable=False),  # of utilization_per10k
    sa.Column("util_sq", sa.BigInteger, nullable=False),  # of utilization_per10k squared
    sa.Column("memory_n", sa.Integer, nullable=False),
    sa.Column("memory_sum", sa.BigInteger, nullable=False),  # of memory_used_kib
    sa.Column("memory_max", sa.BigInteger),
    sa.Index("ix_job_minute_job_id", "job_id", "ts_ms"),
    sqlite_with_rowid=False,
)

_Row = list[Any]  # [util_n, util_sum, util_sq, memory_n, memory_sum, memory_max]


def _encoded(values: list[float], scale: float, limit: int) -> list[int]:
    """Values in stored units, as ``StoredField.sql_encode`` stores them (one that would not fit is left out)."""
    scaled = [value * scale for value in values]
    if scaled and (min(scaled) < -limit or max(scaled) > limit):
        scaled = [value for value in scaled if -limit <= value <= limit]
    return list(map(round, scaled))


_TIMESTAMP: Final = attrgetter("timestamp")
_UUID: Final = attrgetter("uuid")
_UTIL_OF: Final = attrgetter("utilization_ratio")
_MEMORY_OF: Final = attrgetter("memory_used_bytes")
_LAST_MS: Final = attrgetter("last_ms")
_Groups = dict[tuple[int, frozenset[str]], tuple[list[float], list[float]]]


def _node_at_once(gpus: Sequence[GpuReading], held: dict[str, set[str]], stored: Mapping[str, Any]) -> _Groups | None:
    """The common case at C speed: every GPU of the node read at one time, newer than stored, held by the same jobs
    (or none). None when the node is not that case."""
    if len(set(map(_TIMESTAMP, gpus))) != 1:
        return None
    ts_ms = round(gpus[0].timestamp * 1000)
    uuids = list(map(_UUID, gpus))
    if max(map(_LAST_MS, map(stored.__getitem__, uuids))) >= ts_ms:
        return None
    if not held:
        return {}
    jobs = next(iter(held.values()))
    if len(held) != len(gpus) or any(other != jobs for other in held.values()) or held.keys() != set(uuids):
        return None
    utils = [value for value in map(_UTIL_OF, gpus) if value is not None]
    memories = [value for value in map(_MEMORY_OF, gpus) if value is not None]
    return {(ts_ms - ts_ms % schema.MINUTE_MS, frozenset(jobs)): (utils, memories)}


def _each_reading(
    gpus: Iterable[GpuReading],
    held: dict[str, set[str]],
    stored: Mapping[str, Any],
    late: set[int],
    seen: set[tuple[str, int]] | None,
) -> _Groups:
    """Reading by reading: a reading older than stored goes to ``late``, the newest stored again nowhere; one in
    ``seen`` (when given) is skipped."""
    groups: _Groups = {}
    for reading in gpus:
        ts_ms = round(reading.timestamp * 1000)
        minute = ts_ms - ts_ms % schema.MINUTE_MS
        newest = stored[reading.uuid].last_ms
        if ts_ms <= newest:
            if ts_ms < newest:  # the newest stored again (an exporter serving the same snapshot) changes nothing
                late.add(minute)
            continue
        jobs = held.get(reading.uuid)
        if not jobs:
            continue
        if seen is not None:
            if (reading.uuid, ts_ms) in seen:
                continue
            seen.add((reading.uuid, ts_ms))
        key = (minute, frozenset(jobs))
        group = groups.get(key)
        if group is None:
            group = groups[key] = ([], [])
        if reading.utilization_ratio is not None:
            group[0].append(reading.utilization_ratio)
        if reading.memory_used_bytes is not None:
            group[1].append(reading.memory_used_bytes)
    return groups


def increments(
    snapshots: Sequence[NodeSnapshot], stored: Mapping[str, Any], *, unique: bool
) -> tuple[dict[tuple[int, str], _Row], set[int]]:
    """Per (minute, job): what the round's new readings add to the aggregate; and the minutes of the readings older
    than stored, to recompute. ``stored``: per GPU UUID, an object whose ``last_ms`` is the GPU's newest stored
    reading before the round (the writer's state); a reading is new when it is newer, and one at ``last_ms`` (the
    newest stored again) is neither added nor recomputed.

    A reading counts for every job that its own snapshot lists on its GPU, by a job row or by a process. ``unique``:
    no (GPU, time) comes twice in the round (else a repeated one counts once, the last as the writer stores). The
    GPUs of the same jobs and minute are gathered first, then encoded and summed with the per-value work in C.
    """
    groups: _Groups = {}
    late: set[int] = set()
    seen: set[tuple[str, int]] = set()
    for snapshot in snapshots if unique else reversed(snapshots):  # a later duplicate wins, as it is the one stored
        held: dict[str, set[str]] = {}
        for job in snapshot.jobs:
            held.setdefault(job.uuid, set()).add(job.job_id)
        for process in snapshot.processes:
            if process.job_id is not None:
                held.setdefault(process.uuid, set()).add(process.job_id)
        gpus = snapshot.gpus
        node = _node_at_once(gpus, held, stored) if unique else None
        if node is None:
            node = _each_reading(gpus if unique else gpus[::-1], held, stored, late, None if unique else seen)
        for key, (utils, memories) in node.items():
            group = groups.get(key)
            if group is None:
                groups[key] = (utils, memories)
            else:
                group[0].extend(utils)
                group[1].extend(memories)
    out: dict[tuple[int, str], _Row] = {}
    for (minute, jobs), (utils, memories) in groups.items():
        util = _encoded(utils, _UTIL_SCALE, _UTILIZATION.limit)
        memory = _encoded(memories, _MEMORY_SCALE, _MEMORY.limit)
        add = (len(util), sum(util), sum(map(mul, util, util)), len(memory), sum(memory))
        top = max(memory) if memory else None
        for job_id in jobs:
            row = out.get((minute, job_id))
            if row is None:
                out[(minute, job_id)] = [*add, top]
                continue
            for i in range(5):
                row[i] += add[i]
            if top is not None and (row[5] is None or top > row[5]):
                row[5] = top
    return out, late


_SET: Final = ", ".join(f"{c} = job_minute.{c} + excluded.{c}" for c in COLUMNS[:-1])
_SQLITE_UPSERT: Final = (
    f"INSERT INTO job_minute (ts_ms, job_id, {', '.join(COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "  # noqa: S608
    f"ON CONFLICT (ts_ms, job_id) DO UPDATE SET {_SET}, memory_max = CASE WHEN job_minute.memory_max IS NULL "
    "OR excluded.memory_max > job_minute.memory_max THEN excluded.memory_max ELSE job_minute.memory_max END"
)
_PG_TYPES: Final = ("bigint", "text", "integer", "bigint", "bigint", "integer", "bigint", "bigint")
_PG_UPSERT: Final = (
    f"INSERT INTO job_minute (ts_ms, job_id, {', '.join(COLUMNS)}) SELECT * FROM unnest("  # noqa: S608
    + ", ".join(f"%(c{i})s::{kind}[]" for i, kind in enumerate(_PG_TYPES))
    + f") ON CONFLICT (ts_ms, job_id) DO UPDATE SET {_SET}, "
    "memory_max = GREATEST(job_minute.memory_max, excluded.memory_max)"
)


def upsert(conn: Connection, dialect: str, rows: dict[tuple[int, str], _Row]) -> int:
    """Add ``rows`` (from ``increments``) to the stored aggregate; returns the number of (minute, job) rows."""
    if not rows:
        return 0
    values = [(minute, job_id, *row) for (minute, job_id), row in rows.items()]
    if dialect == "sqlite":
        conn.exec_driver_sql(_SQLITE_UPSERT, values)
    else:  # one statement of arrays: no round trip per row
        columns = list(zip(*values, strict=True))
        conn.exec_driver_sql(_PG_UPSERT, {f"c{i}": list(column) for i, column in enumerate(columns)})
    return len(values)


def from_samples_sql(dialect: str, source: str) -> str:
    """SELECT of the aggregate rows of the minutes in ``source`` (a subquery of minute starts ``m``), from raw
    samples and the job allocations: what ``increments`` adds, for readings stored already."""
    util, memory = _UTILIZATION.column, _MEMORY.column
    minute = "(s.ts_ms / 60000) * 60000"
    index_hint = f" AND s.minute = {schema.minute_of('src.m')}" if dialect == "sqlite" else ""  # the key's first column
    return (
        f"SELECT {minute}, a.job_id, count(s.{util}), coalesce(sum(s.{util}), 0), "  # noqa: S608
        f"coalesce(sum(CAST(s.{util} AS BIGINT) * s.{util}), 0), count(s.{memory}), coalesce(sum(s.{memory}), 0), "
        f"max(s.{memory}) FROM ({source}) AS src JOIN gpu_sample AS s ON s.ts_ms >= src.m "
        f"AND s.ts_ms < src.m + 60000{index_hint} JOIN job_allocation AS a ON a.gpu_id = s.gpu_id "
        "AND s.ts_ms >= a.start_ms AND (a.end_ms IS NULL OR s.ts_ms <= a.end_ms) "
        f"GROUP BY {minute}, a.job_id"
    )


def recompute(conn: Connection, dialect: str, minutes: Iterable[int]) -> int:
    """Compute the rows of ``minutes`` (minute starts) again from raw samples; minutes whose raw samples retention
    has removed, or before the table's horizon, are left as they are. Returns the rows written."""
    t = schema.tier_state
    horizons = dict(conn.execute(sa.select(t.c.tier, t.c.horizon_ms).where(t.c.tier.in_(["raw", TIER]))).all())
    floor = max((h for h in horizons.values() if h is not None), default=None)
    wanted = sorted({m for m in minutes if floor is None or m >= floor})
    if not wanted:
        return 0
    source = " UNION ALL ".join(f"SELECT {int(m)} AS m" for m in wanted)
    conn.execute(job_minute.delete().where(job_minute.c.ts_ms.in_(wanted)))
    columns = ", ".join(("ts_ms", "job_id", *COLUMNS))
    result = conn.exec_driver_sql(f"INSERT INTO job_minute ({columns}) {from_samples_sql(dialect, source)}")
    return int(result.rowcount)
