"""NCCL's Inspector in the store: each round's bus bandwidth and collective time per node, job and communicator.

``nccl_bandwidth_round`` keeps one row per (time, node, job, communicator, collective, size class) a node's view
holds (``gpulens.ncclinspect``): its bandwidth, mean time, samples and ranks, and the slowest rank with its GPU.
A node's view holds at most ``MAX_SERIES`` series, so a round writes at most that many rows per node; jobs without
the Inspector write nothing. Rows live as long as raw samples (``prune``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpulens.model import NodeSnapshot
from gpulens.ncclinspect import BandwidthPoint, InspectorSeries, InspectorView
from gpulens.storage.db import Database
from gpulens.storage.schema import metadata

nccl_bandwidth_round = sa.Table(
    "nccl_bandwidth_round",
    metadata,
    sa.Column("ts_ms", sa.BigInteger, primary_key=True),
    sa.Column("node", sa.String(255), primary_key=True),
    sa.Column("job_id", sa.String(255), primary_key=True),
    sa.Column("comm", sa.String(64), primary_key=True),
    sa.Column("collective", sa.String(64), primary_key=True),
    sa.Column("size", sa.String(16), primary_key=True),
    sa.Column("bus_bytes_per_second", sa.Float, nullable=False),
    sa.Column("seconds", sa.Float, nullable=False),
    sa.Column("samples", sa.Integer, nullable=False),
    sa.Column("ranks", sa.Integer, nullable=False),
    sa.Column("slowest_rank", sa.Integer, nullable=True),
    sa.Column("slowest_gpu_uuid", sa.String(80), nullable=True),
    sa.Column("slowest_bus_bytes_per_second", sa.Float, nullable=True),
)
sa.Index("ix_nccl_bandwidth_round_job", nccl_bandwidth_round.c.job_id, nccl_bandwidth_round.c.ts_ms)


def _row(snap: NodeSnapshot, s: InspectorSeries) -> dict[str, Any]:
    return {
        "ts_ms": round(snap.timestamp * 1000),
        "node": snap.node,
        "job_id": (s.job_id or "")[:255],
        "comm": s.comm[:64],
        "collective": s.collective[:64],
        "size": s.size[:16],
        "bus_bytes_per_second": s.bus_bytes_per_second,
        "seconds": s.seconds,
        "samples": s.samples,
        "ranks": s.ranks,
        "slowest_rank": s.slowest_rank,
        "slowest_gpu_uuid": (s.slowest_gpu or None) and s.slowest_gpu[:80],
        "slowest_bus_bytes_per_second": s.slowest_bus_bytes_per_second,
    }


def rows(snapshots: Sequence[NodeSnapshot]) -> list[dict[str, Any]]:
    return [_row(snap, s) for snap in snapshots if snap.inspector is not None for s in snap.inspector.series]


def write(conn: Connection, snapshots: Sequence[NodeSnapshot]) -> int:
    """Store a round's Inspector views in the writer's transaction; a round written again replaces its rows."""
    batch = rows(snapshots)
    if not batch:
        return 0
    t = nccl_bandwidth_round
    for ts, node in {(row["ts_ms"], row["node"]) for row in batch}:
        conn.execute(sa.delete(t).where(t.c.ts_ms == ts, t.c.node == node))
    conn.execute(sa.insert(t), batch)
    return len(batch)


def _series(row: Any) -> InspectorSeries:
    return InspectorSeries(
        job_id=row.job_id or None,
        comm=row.comm,
        collective=row.collective,
        size=row.size,
        bus_bytes_per_second=row.bus_bytes_per_second,
        seconds=row.seconds,
        samples=row.samples,
        ranks=row.ranks,
        slowest_rank=row.slowest_rank,
        slowest_gpu=row.slowest_gpu_uuid,
        slowest_bus_bytes_per_second=row.slowest_bus_bytes_per_second,
    )


def latest_views(db: Database, since: float) -> dict[str, InspectorView]:
    """Each node's newest stored Inspector view since ``since``, by node."""
    t = nccl_bandwidth_round
    newest = (
        sa.select(t.c.node, sa.func.max(t.c.ts_ms).label("ts_ms"))
        .where(t.c.ts_ms >= round(since * 1000))
        .group_by(t.c.node)
        .subquery()
    )
    at = sa.and_(newest.c.node == t.c.node, newest.c.ts_ms == t.c.ts_ms)
    query = sa.select(t).join(newest, at).order_by(t.c.node, t.c.job_id, t.c.comm, t.c.collective, t.c.size)
    with db.session() as session:
        found = session.execute(query).all()
    by_node: dict[str, list[InspectorSeries]] = {}
    for row in found:
        by_node.setdefault(row.node, []).append(_series(row))
    return {node: InspectorView(files=0, records=0, series=tuple(held)) for node, held in by_node.items()}


def job_bandwidth(db: Database, job_id: str, start: float, end: float) -> list[BandwidthPoint]:
    """The job's stored measures between ``start`` and ``end``, oldest first."""
    t = nccl_bandwidth_round
    query = (
        sa.select(t.c.ts_ms, t.c.node, t.c.comm, t.c.collective, t.c.size, t.c.bus_bytes_per_second)
        .where(t.c.job_id == job_id, t.c.ts_ms >= round(start * 1000), t.c.ts_ms <= round(end * 1000))
        .order_by(t.c.ts_ms, t.c.node)
    )
    with db.session() as session:
        found = session.execute(query).all()
    return [BandwidthPoint(r.ts_ms / 1000, r.node, r.comm, r.collective, r.size, r.bus_bytes_per_second) for r in found]


def prune(conn: Connection, before_ms: int) -> int:
    """Forget rounds older than ``before_ms`` (the raw samples' horizon)."""
    t = nccl_bandwidth_round
    return conn.execute(sa.delete(t).where(t.c.ts_ms < before_ms)).rowcount
