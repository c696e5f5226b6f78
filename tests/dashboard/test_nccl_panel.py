"""The job page's NCCL panel over the SQL store: the stuck ranks of the latest round, on their node and GPU, with
the count each reached against the others' and since when it stood still."""

from __future__ import annotations

from gpulens.alerts.ncclchecks import _describe, _Placed, named_ranks
from gpulens.alerts.state import AlertState
from gpulens.dashboard.ncclview import accused_ranks, nccl_panel, read_nccl
from gpulens.ncclmodel import NcclRank
from gpulens.storage.db import Database
from gpulens.storage.sqlreader import SqlReader
from gpulens.storage.writer import Writer
from tests.dashboard.test_pages import text_of
from tests.storage.conftest import T0, _pg_root, clock, db, db_url, pg_server, private_pg_server
from tests.storage.test_ncclstore import _hung

__all__ = ["_pg_root", "clock", "db", "db_url", "pg_server", "private_pg_server"]  # the storage tests' fixtures


def test_the_panel_names_the_stuck_ranks_where_they_run(db: Database) -> None:
    writer = Writer(db)
    for k in range(3):
        writer.write([_hung(T0 + 10 * k)])  # type: ignore[list-item]
    found = read_nccl(SqlReader(db), "job-7", T0, T0 + 60)
    text = text_of(nccl_panel(found, accused={("n1", 11)}))
    assert "NCCL: stuck ranks" in text
    assert "n1:3" in text  # rank 11, on its node and GPU
    assert "2280 of 2281 AllReduce" in text
    assert "dead" in text
    assert "502" in text
    assert nccl_panel(read_nccl(SqlReader(db), "other", T0, T0 + 60)) is None


def test_a_rank_one_behind_that_no_signature_names_is_no_culprit(db: Database) -> None:
    """Rank 11 is one operation behind in every round, but no stall names it: a transient lag, left out; rank 12,
    which RAS holds dead, stays."""
    writer = Writer(db)
    for k in range(3):
        writer.write([_hung(T0 + 10 * k)])  # type: ignore[list-item]
    text = text_of(nccl_panel(read_nccl(SqlReader(db), "job-7", T0, T0 + 60)))
    assert "n1:4" in text  # rank 12, dead
    assert "n1:3" not in text
    assert "1 behind" not in text


def test_the_panel_reads_the_ranks_a_stall_names_from_its_annotation() -> None:
    """The join is the annotation ``ncclchecks`` writes, read back by the same module."""
    lines = "rank 11 (n1 GPU 3 pid 502) at 2280 against 2281\nrank 40 (node-09 GPU ? pid ?) dead"
    stall = AlertState(
        "f",
        "CommunicationStall",
        {"alertname": "CommunicationStall", "job_id": "job-7"},
        {"stuck_ranks": lines},
        "firing",
        T0,
    )
    other = AlertState(
        "g",
        "CommunicationStall",
        {"alertname": "CommunicationStall", "job_id": "job-8"},
        {"stuck_ranks": "rank 1 (n2 GPU 0 pid 1) dead"},
        "firing",
        T0,
    )
    assert accused_ranks([stall, other], "job-7") == {("n1", 11), ("node-09", 40)}
    assert named_ranks(
        _describe(_Placed("n1", NcclRank("job-7", "c", 11, "h", 502, 3, "GPU-3", {}, 1)), None, None)
    ) == {("n1", 11)}
