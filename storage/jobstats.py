"""Job statistics over a time range: GPU-hours, utilization mean and spread, memory used, per job.

A job is its allocations (``job_allocation``: one row per GPU and stretch of time). Each allocation's utilization and
memory partial aggregates (``storage.aggregates``) are read over its window within the range, from the tiers that the
plan (``storage.tiers``) picks for about ``JOB_POINTS`` buckets, then summed per job.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import sqlalchemy as sa

from storage import aggregates, schema, tiers
from storage.db import Database

JOB_POINTS: Final = 24  # jobs() reads the coarsest tier that gives about this many buckets over its range
_UTILIZATION: Final = schema.FIELD_BY_NAME["utilization_ratio"]
_MEMORY: Final = schema.FIELD_BY_NAME["memory_used_bytes"]


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
    utilization_ratio_mean: float | None
    utilization_ratio_stddev: float | None  # over every sample of every GPU; from rollups, over bucket means
    memory_used_bytes_mean: float | None
    memory_used_bytes_max: int | None
    resolution: str


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
    util_n, util_sum, _, _ = aggregates.partials(_UTILIZATION, tier, "s.")
    mem_n, mem_sum, _, mem_max = aggregates.partials(_MEMORY, tier, "s.")
    stats = ", ".join([util_n, util_sum, aggregates.square_sum(_UTILIZATION, tier, "s."), mem_n, mem_sum, mem_max])
    cte, minutes = tiers.minutes_cte(dialect, ":lo", ":hi") if tier == "raw" else ("", "")
    return (
        f"{cte}SELECT a.id, {stats} FROM job_allocation AS a JOIN {tiers.TIER_TABLE[tier]} AS s "  # noqa: S608
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
        plan = tiers.plan(tiers.tier_state(session), start_ms, end_ms, (end_ms - start_ms) / JOB_POINTS)
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
                utilization_ratio_mean=None if mean is None else _UTILIZATION.to_si(mean),
                utilization_ratio_stddev=None if stddev is None else _UTILIZATION.to_si(stddev),
                memory_used_bytes_mean=_MEMORY.to_si(total.mem_sum / total.mem_n) if total.mem_n else None,
                memory_used_bytes_max=None if total.mem_max is None else round(_MEMORY.to_si(total.mem_max)),
                resolution=resolution,
            )
        )
    return sorted(out, key=lambda job: (-job.gpu_hours, job.job_id))
