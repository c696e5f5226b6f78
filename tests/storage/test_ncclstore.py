"""The NCCL view in the store (SQLite and PostgreSQL): a hung job's stuck ranks round by round, nothing for a healthy
one, and retention forgets them with the raw samples."""

from __future__ import annotations

import sqlalchemy as sa

from gpulens.ncclmodel import RANK_DEAD, NcclComm, NcclRank, NcclView
from gpulens.storage import ncclstore
from gpulens.storage.db import Database
from gpulens.storage.writer import Writer
from tests.storage.conftest import T0
from tests.storage.data import snapshot


def _hung(t: float, node: str = "n1") -> object:
    view = NcclView(
        up=True,
        comms=(NcclComm("job-7", "27a079b828ff1a75", 16, "INCOMPLETE,MISMATCH", 2281, "AllReduce", 40.0),),
        ranks=(
            NcclRank("job-7", "27a079b828ff1a75", 10, "10.0.0.2", 501, 2, "GPU-2", {"AllReduce": 2281}, 0),
            NcclRank("job-7", "27a079b828ff1a75", 11, "10.0.0.2", 502, 3, "GPU-3", {"AllReduce": 2280}, 1, busy=True),
            NcclRank("job-7", "27a079b828ff1a75", 12, "10.0.0.2", 503, 4, "GPU-4", {}, None, RANK_DEAD),
        ),
    )
    return snapshot(node, t, gpus=8).replace(nccl=view)


def test_stuck_ranks_are_stored_with_their_rounds(db: Database) -> None:
    writer = Writer(db)
    healthy = snapshot("n0", T0, gpus=8).replace(nccl=NcclView(up=True))
    for k in range(3):
        writer.write([_hung(T0 + 10 * k), healthy])  # type: ignore[list-item]
    found = ncclstore.stuck_ranks(db, "job-7", T0, T0 + 30)
    assert [(s.rank, s.state) for s in found[:2]] == [(11, "ok"), (12, "dead")]
    assert len(found) == 6
    first = found[0]
    assert (first.node, first.gpu, first.pid, first.count, first.top_count, first.collective) == (
        "n1",
        3,
        502,
        2280,
        2281,
        "AllReduce",
    )
    assert ncclstore.stuck_ranks(db, "other", T0, T0 + 30) == []
    views = ncclstore.latest_views(db, T0)  # what the stall rule weighs: the writer's busy kept
    assert {(r.rank, r.busy) for r in views["n1"].ranks} == {(11, True), (12, None)}
    with db.write_transaction() as conn:
        assert ncclstore.prune(conn, round((T0 + 15) * 1000)) == 6  # 2 rounds x (1 comm + 2 ranks)
        left = conn.execute(sa.select(sa.func.count()).select_from(ncclstore.nccl_rank_round)).scalar_one()
    assert left == 2
