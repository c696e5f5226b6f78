"""Job statistics over a time range: GPU-hours, utilization mean and spread, memory used, per job.

A job is its allocations (``job_allocation``: one row per GPU and stretch of time), which give its GPUs, nodes, first
and last seen and GPU-hours. Utilization and memory come from the per-job minute aggregate that the writer keeps
(``storage.jobminute``), summed per job in SQL. For minutes before that aggregate's horizon, each allocation's partial
aggregates (``storage.aggregates``) are read over its window from the tiers that the plan (``storage.tiers``) picks for
about ``JOB_POINTS`` buckets (1-minute rollups, raw samples after their position), and summed per job in SQL.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import sqlalchemy as sa

from gpulens.storage import aggregates, jobminute, schema, tiers
from gpulens.storage.db import Database
from gpulens.storage.records import JOB_POINTS, JobSummary

_UTILIZATION: Final = schema.FIELD_BY_NAME["utilization_ratio"]
_MEMORY: Final = schema.FIELD_BY_NAME["memory_used_bytes"]


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


def _job_stats_sql(dialect: str, tier: str, one_job: bool) -> str:
    """Per job: utilization count/sum/sum of squares and memory count/sum/max, each allocation's samples taken within
    its own window of [lo, hi). Grouped in SQL, so that a page of 1,000 nodes gets one row per job, not per GPU."""
    util_n, util_sum, _, _ = aggregates.partials(_UTILIZATION, tier, "s.")
    mem_n, mem_sum, _, mem_max = aggregates.partials(_MEMORY, tier, "s.")
    stats = ", ".join([util_n, util_sum, aggregates.square_sum(_UTILIZATION, tier, "s."), mem_n, mem_sum, mem_max])
    cte, minutes = tiers.minutes_cte(dialect, ":lo", ":hi", "s") if tier == "raw" else ("", "")
    return (
        f"{cte}SELECT a.job_id, {stats} FROM job_allocation AS a JOIN {tiers.TIER_TABLE[tier]} AS s "  # noqa: S608
        "ON s.gpu_id = a.gpu_id AND s.ts_ms >= CASE WHEN a.start_ms > :lo THEN a.start_ms ELSE :lo END "
        "AND s.ts_ms < CASE WHEN a.end_ms IS NOT NULL AND a.end_ms < :hi THEN a.end_ms + 1 ELSE :hi END "
        "WHERE a.start_ms < :hi AND (a.end_ms IS NULL OR a.end_ms >= :lo) "
        f"{'AND a.job_id = :job ' if one_job else ''}{minutes} GROUP BY a.job_id"
    )


def _aggregate_sql(one_job: bool) -> str:
    """Per job: the sums of ``job_minute`` over the minutes that start within [lo, hi)."""
    return (
        "SELECT job_id, sum(util_n), sum(util_sum), sum(util_sq), sum(memory_n), sum(memory_sum), max(memory_max) "  # noqa: S608
        f"FROM job_minute WHERE ts_ms >= :lo AND ts_ms < :hi {'AND job_id = :job ' if one_job else ''}GROUP BY job_id"
    )


def jobs(db: Database, start: float, end: float, *, job_id: str | None = None) -> list[JobSummary]:
    """Every job (or only ``job_id``) that held a GPU during [start, end], most GPU-hours first.

    Reads the allocations in the range (one row per GPU), then the per-job minute aggregate that the writer keeps
    (``storage.jobminute``): one row per job and minute, whatever the number of GPUs. Minutes before the aggregate's
    horizon (before the upgrade that created it, or past its retention) are read as before: one grouped statement per
    tier of the plan, the 1-minute (or 1-hour) rollups up to the rollup position and raw samples after it.
    """
    start_ms, end_ms = round(start * 1000), round(end * 1000)
    a, g = schema.job_allocation, schema.gpu
    effective_end = sa.func.coalesce(a.c.end_ms, schema.newest_sample_ms(db.dialect), a.c.start_ms).label("end_ms")
    with db.session() as session:
        allocations = session.execute(
            sa.select(a.c.job_id, a.c.user_name, a.c.start_ms, effective_end, g.c.uuid, g.c.node)
            .join(g, g.c.id == a.c.gpu_id)
            .where(a.c.start_ms <= end_ms, sa.or_(a.c.end_ms.is_(None), a.c.end_ms >= start_ms))
            .where(sa.true() if job_id is None else a.c.job_id == job_id)
        ).all()
        allocations = [row for row in allocations if row[3] >= start_ms]
        if not allocations:
            return []
        state = tiers.tier_state(session)
        # No row: a store before revision 0009, without the aggregate; every minute from the rollups.
        horizon = state[jobminute.TIER][1] if jobminute.TIER in state else end_ms + 1
        params: dict[str, Any] = {} if job_id is None else {"job": job_id}
        stats: dict[str, _JobStats] = defaultdict(_JobStats)
        resolution = "1m"
        if horizon is not None and start_ms < horizon:  # before the aggregate: the rollups, as before
            plan = tiers.plan(state, start_ms, min(end_ms, horizon - 1), (end_ms - start_ms) / JOB_POINTS)
            resolution = plan[0].tier
            for segment in plan:
                sql = sa.text(_job_stats_sql(db.dialect, segment.tier, job_id is not None))
                for row in session.execute(sql, {**params, "lo": segment.lo_ms, "hi": segment.hi_ms}):
                    stats[row[0]].add(row[1:])
        lo = start_ms if horizon is None else max(start_ms, horizon)
        if lo <= end_ms:
            for row in session.execute(
                sa.text(_aggregate_sql(job_id is not None)), {**params, "lo": lo, "hi": end_ms + 1}
            ):
                stats[row[0]].add(row[1:])
    return _job_summaries(allocations, stats, start_ms, end_ms, resolution)


@dataclass(slots=True)
class _Held:
    """What a job's allocations say: who, where, when, and GPU-milliseconds within the range."""

    user: str | None = None
    gpus: set[str] = field(default_factory=set)
    nodes: set[str] = field(default_factory=set)
    first_ms: int | None = None
    last_ms: int | None = None
    gpu_ms: int = 0


def _job_summaries(
    allocations: Sequence[Any], stats: Mapping[str, _JobStats], start_ms: int, end_ms: int, resolution: str
) -> list[JobSummary]:
    held: dict[str, _Held] = defaultdict(_Held)
    for job, user, alloc_start, alloc_end, uuid, node in allocations:
        h = held[job]
        if h.user is None:
            h.user = user
        h.gpus.add(uuid)
        h.nodes.add(node)
        h.first_ms = alloc_start if h.first_ms is None else min(h.first_ms, alloc_start)
        h.last_ms = alloc_end if h.last_ms is None else max(h.last_ms, alloc_end)
        h.gpu_ms += max(0, min(alloc_end, end_ms) - max(alloc_start, start_ms))
    out: list[JobSummary] = []
    empty = _JobStats()
    for job_id, h in held.items():
        total = stats.get(job_id, empty)
        mean = total.util_sum / total.util_n if total.util_n else None
        stddev = math.sqrt(max(0.0, total.util_sq / total.util_n - mean * mean)) if mean is not None else None
        out.append(
            JobSummary(
                job_id=job_id,
                user=h.user,
                gpus=tuple(sorted(h.gpus)),
                nodes=tuple(sorted(h.nodes)),
                first_seen=(h.first_ms or 0) / 1000,
                last_seen=(h.last_ms or 0) / 1000,
                gpu_hours=h.gpu_ms / schema.HOUR_MS,
                utilization_ratio_mean=None if mean is None else _UTILIZATION.to_si(mean),
                utilization_ratio_stddev=None if stddev is None else _UTILIZATION.to_si(stddev),
                memory_used_bytes_mean=_MEMORY.to_si(total.mem_sum / total.mem_n) if total.mem_n else None,
                memory_used_bytes_max=None if total.mem_max is None else round(_MEMORY.to_si(total.mem_max)),
                resolution=resolution,
            )
        )
    return sorted(out, key=lambda job: (-job.gpu_hours, job.job_id))
