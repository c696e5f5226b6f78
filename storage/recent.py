"""The recent past as scrape rounds: the stored readings of the last minutes, regrouped into rounds, for an alert
engine that restarts to rebuild the history its baselines need.

The store keeps each reading's own timestamp, not the round it arrived in, so rounds are rebuilt by the collector's
interval: readings whose timestamps fall in the same interval form one round (the newest reading of a GPU wins if a
node's clock put two in one interval). Jobs come from the allocation intervals of ``job_allocation``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import sqlalchemy as sa

from gpulens.model import GpuJob, GpuReading, NodeSnapshot
from gpulens.storage import latest, schema, tiers
from gpulens.storage.db import Database

SOURCE = "store"  # the source name of rebuilt snapshots


def recent_rounds(
    db: Database, *, since: float, until: float, interval_s: float
) -> list[tuple[float, list[NodeSnapshot]]]:
    """Every round between ``since`` and ``until`` (seconds), oldest first: (round time, one snapshot per node)."""
    if interval_s <= 0:
        raise ValueError("interval_s must be positive")
    columns, booleans, xids = latest.reading_columns(db.dialect)
    params = {"since": round(since * 1000), "until": round(until * 1000)}
    cte, minutes = tiers.minutes_cte(db.dialect, ":since", ":until", "s")  # SQLite: seek the minutes, not a scan
    sql = (
        f"{cte}SELECT {columns} FROM gpu_sample AS s JOIN gpu AS g ON g.id = s.gpu_id "  # noqa: S608 (constant identifiers)
        "JOIN gpu_profile AS p ON p.profile_id = s.profile_id "
        f"WHERE s.ts_ms >= :since AND s.ts_ms <= :until {minutes} ORDER BY s.ts_ms"
    )
    a, g = schema.job_allocation, schema.gpu
    with db.session() as session:
        rows = session.execute(sa.text(sql), params).all()
        allocations = session.execute(
            sa.select(g.c.node, g.c.gpu_index, g.c.uuid, a.c.job_id, a.c.user_name, a.c.start_ms, a.c.end_ms)
            .join(a, a.c.gpu_id == g.c.id)
            .where(sa.or_(a.c.end_ms.is_(None), a.c.end_ms >= params["since"]))
            .where(a.c.start_ms <= params["until"])
        ).all()
    buckets: dict[int, dict[str, GpuReading]] = defaultdict(dict)
    for row in rows:
        reading = latest.reading_from_row(row, booleans, xids)
        buckets[int(reading.timestamp // interval_s)][reading.uuid] = reading
    jobs_by_gpu: dict[str, list[tuple[GpuJob, int, int | None]]] = defaultdict(list)
    for node, index, uuid, job_id, user, start_ms, end_ms in allocations:
        jobs_by_gpu[uuid].append((GpuJob(node, index, uuid, job_id, user), start_ms, end_ms))
    rounds = []
    for key in sorted(buckets):
        readings = buckets[key].values()
        time = max(r.timestamp for r in readings)
        rounds.append((time, _snapshots(readings, jobs_by_gpu, time, interval_s)))
    return rounds


def _snapshots(
    readings: Iterable[GpuReading],
    jobs_by_gpu: dict[str, list[tuple[GpuJob, int, int | None]]],
    time: float,
    interval_s: float,
) -> list[NodeSnapshot]:
    by_node: dict[str, list[GpuReading]] = defaultdict(list)
    for reading in readings:
        by_node[reading.node].append(reading)
    at_ms, slack_ms = round(time * 1000), round(interval_s * 1000)
    out = []
    for node, gpus in sorted(by_node.items()):
        held = tuple(
            job
            for r in gpus
            for job, start_ms, end_ms in jobs_by_gpu.get(r.uuid, ())
            if start_ms <= at_ms and (end_ms is None or end_ms >= at_ms - slack_ms)
        )
        stamp = max(r.timestamp for r in gpus)
        out.append(NodeSnapshot(node, stamp, SOURCE, gpus=tuple(sorted(gpus, key=lambda r: r.gpu)), jobs=held))
    return out
