"""The idle share of the allocated GPU time over a period, bucket by bucket, per user, account or partition.

A bucket counts the raw samples of each GPU while a job held it (``job_allocation``), and among them those below
``Prices.idle_utilization``: the rule of a job's ``idle_ratio`` (``storage.jobsummary.idle_below``), so a group's
share over the whole period is the report's (``storage.usagereport``) for the jobs inside it. Groups as there: users
from the allocations, accounts and partitions from Slurm's ``job_info``, ``(unknown)`` for a job without one. The
work is bounded by the buckets (``step_for``: at most ``MAX_BUCKETS``) times the groups; the samples are read within
the raw retention only, so a bucket older than it is absent, not zero.
"""

from __future__ import annotations

import math
from typing import Final

import sqlalchemy as sa

from gpulens.settings import Prices
from gpulens.storage import jobsummary, schema, slurmtables
from gpulens.storage.db import Database
from gpulens.storage.records import IdlePoint
from gpulens.storage.usagereport import GROUPINGS, UNKNOWN

MAX_BUCKETS: Final = 120
STEPS: Final = (300.0, 900.0, 3600.0, 6 * 3600.0, 86400.0, 7 * 86400.0)  # the bucket widths, smallest first


def step_for(seconds: float) -> float:
    """The smallest bucket width in ``STEPS`` that covers ``seconds`` in at most ``MAX_BUCKETS`` buckets."""
    return next((s for s in STEPS if seconds / s <= MAX_BUCKETS), STEPS[-1])


def idle_trend(db: Database, by: str, start: float, end: float, step_s: float, prices: Prices) -> list[IdlePoint]:
    """Per bucket of ``step_s`` from ``start`` and per group: the allocated GPUs' samples and the idle ones among them,
    oldest bucket first."""
    if by not in GROUPINGS:
        raise ValueError(f"by: expected one of {', '.join(GROUPINGS)}")
    s, a, info = schema.gpu_sample, schema.job_allocation, slurmtables.job_info
    util = s.c[schema.FIELD_BY_NAME["utilization_ratio"].column]
    start_ms, end_ms, step_ms = round(start * 1000), round(end * 1000), round(step_s * 1000)
    bucket = ((s.c.ts_ms - start_ms) // step_ms).label("bucket")
    joined = s.join(
        a,
        sa.and_(
            s.c.gpu_id == a.c.gpu_id,
            s.c.ts_ms >= a.c.start_ms,
            s.c.ts_ms <= sa.func.coalesce(a.c.end_ms, end_ms),
        ),
    )
    if by == "user":
        group = a.c.user_name
    else:
        joined = joined.outerjoin(info, info.c.job_id == a.c.job_id)
        group = info.c.account if by == "account" else info.c.partition
    query = (
        sa.select(
            bucket,
            group.label("grp"),
            sa.func.count(util),
            sa.func.sum(sa.case((util < jobsummary.idle_below(prices), 1), else_=0)),
        )
        .select_from(joined)
        .where(s.c.ts_ms >= start_ms, s.c.ts_ms <= end_ms)
        .group_by(bucket, group)
        .order_by(bucket)
    )
    with db.session() as session:
        rows = session.execute(query).all()
    last = max(0, math.ceil((end - start) / step_s) - 1)  # a sample at ``end`` itself counts in the last bucket
    points: dict[tuple[int, str], list[int]] = {}
    for b, name, samples, idle in rows:  # NULL and '' groups fold into one
        counts = points.setdefault((min(int(b), last), name or UNKNOWN), [0, 0])
        counts[0] += int(samples or 0)
        counts[1] += int(idle or 0)
    return [
        IdlePoint(start + b * step_s, name, samples, idle)
        for (b, name), (samples, idle) in sorted(points.items())
        if samples
    ]
