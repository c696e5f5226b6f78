"""The job page's NCCL panel over the SQL store: the stuck ranks of the latest round, on their node and GPU, with
the count each reached against the others' and since when it stood still."""

from __future__ import annotations

from gpulens.dashboard.ncclview import nccl_panel, read_nccl
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
    text = text_of(nccl_panel(found))
    assert "NCCL: stuck ranks" in text
    assert "n1:3" in text  # rank 11, on its node and GPU
    assert "2280 of 2281 AllReduce" in text
    assert "dead" in text
    assert "502" in text
    assert nccl_panel(read_nccl(SqlReader(db), "other", T0, T0 + 60)) is None
