"""The page callbacks issue a bounded number of SQL statements, in one transaction, whatever the cluster size.

Two stores written the same way, one with 10 nodes and one with 40, each with an hour of 10 s rounds rolled up;
each page's server render is run against both with a SQLAlchemy event hook counting what reaches the database.
The counts must not grow with the cluster, and each page view must open exactly one transaction (one snapshot):
on PostgreSQL, a REPEATABLE READ one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from bench.bench_dashboard import END, Cluster, build, stall_alert, timeline
from gpulens.clock import ManualClock
from gpulens.dashboard import snapshot
from gpulens.dashboard.components import ViewState
from gpulens.dashboard.context import Context
from gpulens.dashboard.grid import NODES_PER_PAGE
from gpulens.dashboard.pages import gpu, interconnect, job, jobs, node, overview
from gpulens.storage.db import Database
from gpulens.storage.rollup import Rollups
from gpulens.storage.sqlreader import SnapshotReader, SqlReader
from tests.dbtemplate import migrated_sqlite
from tests.storage.conftest import PgServer, _pg_root, pg_server  # noqa: F401 (fixtures)

SIZES = (10, 40)


@dataclass
class Counted:
    db: Database
    cluster: Cluster
    statements: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, Counted]]:
    made: dict[int, Counted] = {}
    for nodes in SIZES:
        path: Path = tmp_path_factory.mktemp(f"bounds{nodes}") / "gpulens.db"
        db = Database(migrated_sqlite(path), clock=ManualClock(END))
        cluster = Cluster(nodes, 8)
        build(db, cluster, timeline(1.5, 60, 0.25, 10))
        Rollups(db, settle_s=0).run(END)
        counted = Counted(db, cluster)
        sa.event.listen(
            db.engine, "before_cursor_execute", lambda _c, _cur, sql, *_a, seen=counted: seen.statements.append(sql)
        )
        made[nodes] = counted
    yield made
    for counted in made.values():
        counted.db.close()


PAGES: dict[str, Callable[[Context, Cluster], Any]] = {
    "node 1h": lambda c, cl: node.render(c, ViewState(range="1h"), cl.names[1]),
    "node 24h": lambda c, cl: node.render(c, ViewState(range="24h"), cl.names[1]),
    "gpu 24h": lambda c, cl: gpu.render(c, ViewState(range="24h"), cl.identity[1][3][2]),
    "jobs 1h": lambda c, cl: jobs.render(c, ViewState(range="1h"), "all", "", 1),
    "jobs 24h": lambda c, cl: jobs.render(c, ViewState(range="24h"), "all", "", 1),
    "job 1h": lambda c, cl: job.render(c, ViewState(range="1h"), "job-0"),
    "overview": lambda c, cl: overview.render(c, ViewState(range="1h"), "utilization", "name", "", 1),
    "interconnect": lambda c, cl: interconnect.render(c, ViewState(range="1h"), None),
}


def _statements(counted: Counted, page: str) -> list[str]:
    context = Context(db=counted.db, clock=ManualClock(END), alerts=stall_alert(counted.cluster))
    PAGES[page](context, counted.cluster)  # warm: the first call may read the tier state
    counted.statements.clear()
    PAGES[page](context, counted.cluster)
    return list(counted.statements)


@pytest.mark.parametrize("page", list(PAGES))
def test_statement_count_does_not_grow_with_the_cluster(stores: dict[int, Counted], page: str) -> None:
    small, large = (_statements(stores[n], page) for n in SIZES)
    assert small, "the page read nothing"
    assert len(small) == len(large), f"{page}: {len(small)} statements at 10 nodes, {len(large)} at 40"
    assert len(large) <= 20


@pytest.mark.parametrize("page", list(PAGES))
def test_one_page_view_is_one_transaction(stores: dict[int, Counted], page: str) -> None:
    begins = [s for s in _statements(stores[40], page) if s.strip().upper().startswith("BEGIN")]
    assert len(begins) == 1, f"{page}: {len(begins)} transactions"


def test_a_page_view_on_postgresql_is_one_repeatable_read_snapshot(pg_server: PgServer) -> None:  # noqa: F811
    name = pg_server.create_database()
    db = Database(pg_server.url(name), clock=ManualClock(END))
    try:
        db.upgrade()
        cluster = Cluster(4, 8)
        build(db, cluster, timeline(0.25, 60, 0.1, 10))
        with snapshot.pinned(SqlReader(db)) as reader:
            assert isinstance(reader, SnapshotReader)
            with reader.db.session() as session:
                assert session.execute(sa.text("SHOW transaction_isolation")).scalar() == "repeatable read"
        context = Context(db=db, clock=ManualClock(END), alerts=stall_alert(cluster))
        status, info, *_ = node.render(context, ViewState(range="1h"), cluster.names[1])
        assert status is None
        assert info.startswith("8 x ")
        assert jobs.render(context, ViewState(range="1h"), "all", "", 1)[1] is not None
    finally:
        db.close()
        pg_server.drop_database(name)


def test_the_jobs_page_reads_the_readings_of_the_nodes_its_grid_shows_only(stores: dict[int, Counted]) -> None:
    """40 nodes with jobs, 32 a page: the newest readings are asked for the held GPUs of one page's nodes."""
    counted = stores[40]
    context = Context(db=counted.db, clock=ManualClock(END), alerts=stall_alert(counted.cluster))
    asked: list[int] = []

    def capture(_c: Any, _cur: Any, sql: str, params: Any, *_a: Any) -> None:
        if "gpu_sample" in sql and "uuid IN" in sql.replace("\n", " "):
            asked.append(len(params))

    sa.event.listen(counted.db.engine, "before_cursor_execute", capture)
    try:
        first = jobs.render(context, ViewState(range="1h"), "all", "", 1)
        second = jobs.render(context, ViewState(range="1h"), "all", "", 2)
    finally:
        sa.event.remove(counted.db.engine, "before_cursor_execute", capture)
    assert len(asked) == 2, asked
    assert asked[0] <= NODES_PER_PAGE * 8 + 10, asked  # the uuids of 32 nodes, and a few other parameters
    assert asked[1] <= 8 * 8 + 10, asked  # the second page: the 8 nodes left
    assert (first[3], second[3]) == ("nodes 1 to 32 of 40 with jobs", "nodes 33 to 40 of 40 with jobs")
