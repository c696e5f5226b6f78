"""NCCL's Inspector in the store (SQLite and PostgreSQL): each round's bandwidth per node, job and communicator,
the newest view per node (what the engine over SQL reads), a job's bandwidth over time (the job page), and
retention forgetting them with the raw samples."""

from __future__ import annotations

import sqlalchemy as sa

from gpulens.ncclinspect import InspectorSeries, InspectorView
from gpulens.storage import inspectorstore
from gpulens.storage.db import Database
from gpulens.storage.writer import Writer
from tests.storage.conftest import T0
from tests.storage.data import snapshot


def _measured(t: float, node: str, bus: float) -> object:
    view = InspectorView(
        files=2,
        records=16,
        series=(
            InspectorSeries(
                "job-7", "0x5f1e22c7a90b4d", "AllReduce", "256MiB", bus, 0.0113, 8, 8, 3, "GPU-3", bus * 0.9
            ),
            InspectorSeries("job-7", "0x0a7d93e15c2b11", "AllGather", "8MiB", 2.4e11, 4.5e-5, 8, 8),
        ),
    )
    return snapshot(node, t, gpus=8).replace(inspector=view)


def test_rounds_are_stored_and_read_back(db: Database) -> None:
    writer = Writer(db)
    for k in range(3):
        writer.write([_measured(T0 + 10 * k, "n1", 45e9 - k * 1e9), _measured(T0 + 10 * k, "n2", 44e9)])  # type: ignore[list-item]
    writer.write([snapshot("n3", T0 + 20, gpus=8)])  # no Inspector: nothing stored
    points = inspectorstore.job_bandwidth(db, "job-7", T0, T0 + 30)
    assert len(points) == 12  # 3 rounds x 2 nodes x 2 series
    first = [p for p in points if p.node == "n1" and p.collective == "AllReduce"]
    assert [p.bus_bytes_per_second for p in first] == [45e9, 44e9, 43e9]
    assert inspectorstore.job_bandwidth(db, "other", T0, T0 + 30) == []
    views = inspectorstore.latest_views(db, T0 + 15)
    assert set(views) == {"n1", "n2"}
    newest = next(s for s in views["n1"].series if s.collective == "AllReduce")
    assert (newest.bus_bytes_per_second, newest.slowest_rank, newest.slowest_gpu) == (43e9, 3, "GPU-3")
    assert newest.slowest_bus_bytes_per_second == 43e9 * 0.9
    assert inspectorstore.latest_views(db, T0 + 25) == {}
    with db.write_transaction() as conn:
        assert inspectorstore.prune(conn, round((T0 + 15) * 1000)) == 8  # 2 rounds x 2 nodes x 2 series
        left = conn.execute(sa.select(sa.func.count()).select_from(inspectorstore.nccl_bandwidth_round)).scalar_one()
    assert left == 4


def test_a_round_written_again_replaces_its_rows(db: Database) -> None:
    writer = Writer(db)
    writer.write([_measured(T0, "n1", 45e9)])  # type: ignore[list-item]
    writer.write([_measured(T0, "n1", 30e9)])  # type: ignore[list-item]
    points = [p for p in inspectorstore.job_bandwidth(db, "job-7", T0, T0) if p.collective == "AllReduce"]
    assert [p.bus_bytes_per_second for p in points] == [30e9]
