"""NCCL's view of the jobs (NCCL RAS) in the store: each round's communicators and the ranks that stood out.

``nccl_comm_round`` keeps, for every round in which a node's view shows a communicator out of step (``status`` not
``OK``), one row per (time, node, communicator): its status, the collective, the highest count and how long the same
mismatch has held. ``nccl_rank_round`` keeps the ranks behind or unreachable in that round, with their GPU, pid,
state, lag, count and whether its node saw it busy copying to the host (a checkpoint writer). A healthy job writes
nothing; a hung one writes a few rows per node and round, so the job page can draw each stuck rank's progress on its
node and GPU. Rows live as long as raw samples (``prune``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpulens.model import NodeSnapshot
from gpulens.ncclmodel import RANK_OK, NcclComm, NcclRank, NcclView
from gpulens.storage.db import Database
from gpulens.storage.records import StuckRank
from gpulens.storage.schema import metadata

nccl_comm_round = sa.Table(
    "nccl_comm_round",
    metadata,
    sa.Column("ts_ms", sa.BigInteger, primary_key=True),
    sa.Column("node", sa.String(255), primary_key=True),
    sa.Column("comm", sa.String(16), primary_key=True),
    sa.Column("job_id", sa.String(255), nullable=False),
    sa.Column("size", sa.Integer, nullable=False),
    sa.Column("status", sa.String(64), nullable=False),
    sa.Column("collective", sa.String(32), nullable=True),
    sa.Column("top_count", sa.BigInteger, nullable=True),
    sa.Column("mismatch_age_s", sa.Float, nullable=True),
)
sa.Index("ix_nccl_comm_round_job", nccl_comm_round.c.job_id, nccl_comm_round.c.ts_ms)

nccl_rank_round = sa.Table(
    "nccl_rank_round",
    metadata,
    sa.Column("ts_ms", sa.BigInteger, primary_key=True),
    sa.Column("node", sa.String(255), primary_key=True),
    sa.Column("comm", sa.String(16), primary_key=True),
    sa.Column("rank", sa.Integer, primary_key=True),
    sa.Column("job_id", sa.String(255), nullable=False),
    sa.Column("gpu", sa.Integer, nullable=True),
    sa.Column("gpu_uuid", sa.String(64), nullable=True),
    sa.Column("pid", sa.Integer, nullable=True),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("lag", sa.BigInteger, nullable=True),
    sa.Column("count", sa.BigInteger, nullable=True),
    sa.Column("busy", sa.Boolean, nullable=True),  # its own node saw its GPU copy to the host (exporter.ncclbusy)
)
sa.Index("ix_nccl_rank_round_job", nccl_rank_round.c.job_id, nccl_rank_round.c.ts_ms)


def rows(snapshots: Sequence[NodeSnapshot]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The communicator and rank rows of a round."""
    comms: list[dict[str, Any]] = []
    ranks: list[dict[str, Any]] = []
    for snap in snapshots:
        view = snap.nccl
        if view is None or not view.up:
            continue
        ts = round(snap.timestamp * 1000)
        out_of_step = {}
        for c in view.comms:
            if c.status != "OK":
                out_of_step[c.comm] = c
                comms.append(
                    {
                        "ts_ms": ts,
                        "node": snap.node,
                        "comm": c.comm,
                        "job_id": c.job_id or "",
                        "size": c.size,
                        "status": c.status[:64],
                        "collective": c.collective,
                        "top_count": c.top_count,
                        "mismatch_age_s": c.mismatch_age_s,
                    }
                )
        for r in view.ranks:
            comm = out_of_step.get(r.comm)
            if comm is None or (r.state == RANK_OK and not r.lag):
                continue
            ranks.append(
                {
                    "ts_ms": ts,
                    "node": snap.node,
                    "comm": r.comm,
                    "rank": r.rank,
                    "job_id": r.job_id or "",
                    "gpu": r.gpu,
                    "gpu_uuid": r.gpu_uuid,
                    "pid": r.pid,
                    "state": r.state,
                    "lag": r.lag,
                    "count": r.counts.get(comm.collective) if comm.collective else None,
                    "busy": r.busy,
                }
            )
    return comms, ranks


def write(conn: Connection, snapshots: Sequence[NodeSnapshot]) -> int:
    """Store a round's NCCL view in the writer's transaction; a round written again replaces its rows."""
    comms, ranks = rows(snapshots)
    for table, batch in ((nccl_comm_round, comms), (nccl_rank_round, ranks)):
        if not batch:
            continue
        keys = {(row["ts_ms"], row["node"]) for row in batch}
        for ts, node in keys:
            conn.execute(sa.delete(table).where(table.c.ts_ms == ts, table.c.node == node))
        conn.execute(sa.insert(table), batch)
    return len(comms) + len(ranks)


def stuck_ranks(db: Database, job_id: str, start: float, end: float) -> list[StuckRank]:
    """The ranks of ``job_id`` that stood out between ``start`` and ``end``, oldest first."""
    r, c = nccl_rank_round, nccl_comm_round
    query = (
        sa.select(r, c.c.top_count, c.c.collective)
        .join(c, sa.and_(c.c.ts_ms == r.c.ts_ms, c.c.node == r.c.node, c.c.comm == r.c.comm))
        .where(r.c.job_id == job_id, r.c.ts_ms >= round(start * 1000), r.c.ts_ms <= round(end * 1000))
        .order_by(r.c.ts_ms, r.c.rank)
    )
    with db.session() as session:
        found = session.execute(query).all()
    return [
        StuckRank(
            row.ts_ms / 1000,
            row.node,
            row.comm,
            row.rank,
            row.gpu,
            row.gpu_uuid,
            row.pid,
            row.state,
            row.lag,
            row._mapping["count"],
            row.top_count,
            row.collective,
        )
        for row in found
    ]


def latest_views(db: Database, since: float) -> dict[str, NcclView]:
    """Each node's newest stored NCCL view since ``since``: its communicators out of step and the ranks that stood
    out then (what the stall rules weigh; a node whose communicators all agree stores nothing and has no view)."""
    c, r = nccl_comm_round, nccl_rank_round
    newest = (
        sa.select(c.c.node, sa.func.max(c.c.ts_ms).label("ts_ms"))
        .where(c.c.ts_ms >= round(since * 1000))
        .group_by(c.c.node)
        .subquery()
    )
    at = sa.and_(newest.c.node == c.c.node, newest.c.ts_ms == c.c.ts_ms)
    at_rank = sa.and_(newest.c.node == r.c.node, newest.c.ts_ms == r.c.ts_ms)
    with db.session() as session:
        comm_rows = session.execute(sa.select(c).join(newest, at)).all()
        rank_rows = session.execute(sa.select(r).join(newest, at_rank)).all()
    comms: dict[str, list[NcclComm]] = {}
    collective: dict[tuple[str, str], str | None] = {}
    for row in comm_rows:
        comms.setdefault(row.node, []).append(
            NcclComm(
                row.job_id or None,
                row.comm,
                row.size,
                row.status,
                top_count=row.top_count,
                collective=row.collective,
                mismatch_age_s=row.mismatch_age_s,
            )
        )
        collective[(row.node, row.comm)] = row.collective
    ranks: dict[str, list[NcclRank]] = {}
    for row in rank_rows:
        name = collective.get((row.node, row.comm))
        count = row._mapping["count"]
        ranks.setdefault(row.node, []).append(
            NcclRank(
                row.job_id or None,
                row.comm,
                row.rank,
                "",
                pid=row.pid,
                gpu=row.gpu,
                gpu_uuid=row.gpu_uuid,
                counts={name: count} if name and count is not None else {},
                lag=row.lag,
                state=row.state,
                busy=row.busy,
            )
        )
    return {node: NcclView(True, comms=tuple(held), ranks=tuple(ranks.get(node, ()))) for node, held in comms.items()}


def prune(conn: Connection, before_ms: int) -> int:
    """Forget rounds older than ``before_ms`` (the raw samples' horizon)."""
    return sum(
        conn.execute(sa.delete(t).where(t.c.ts_ms < before_ms)).rowcount for t in (nccl_comm_round, nccl_rank_round)
    )
