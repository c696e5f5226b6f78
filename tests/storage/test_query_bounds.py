"""The node page's reads stay bounded whatever the cluster's size: the same number of SQL statements, and rows
returned proportional to one node, on a store of 10 nodes and on one of 50 (SQLite and PostgreSQL).

A regression check without timing: every SELECT the storage issues is counted, and its rows are counted by running
the same statement, with the same parameters, wrapped in ``SELECT count(*)`` on a cursor of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from gpulens.clock import ManualClock
from gpulens.dashboard.panels import FIELDS
from gpulens.storage.db import Database
from gpulens.storage.sqlreader import SqlReader
from gpulens.storage.writer import Writer
from tests.storage.conftest import T0
from tests.storage.data import snapshot

GPUS = 4
ROUNDS = 12
STEP_S = 10.0


@dataclass
class Tally:
    statements: int = 0
    rows: int = 0
    seen: list[str] = field(default_factory=list)
    text: list[str] = field(default_factory=list)  # each statement whole


@contextmanager
def counting(db: Database) -> Iterator[Tally]:
    """Count the SELECT statements run on ``db`` and the rows each returns, while the block runs."""
    tally = Tally()
    busy = [False]

    def after(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        if busy[0] or executemany or not statement.lstrip().upper().startswith(("SELECT", "WITH")):
            return
        busy[0] = True
        try:
            counter = cursor.connection.cursor()
            counter.execute(f"SELECT count(*) FROM ({statement}) AS counted", parameters)
            tally.rows += int(counter.fetchone()[0])
            counter.close()
        finally:
            busy[0] = False
        tally.statements += 1
        tally.seen.append(" ".join(statement.split())[:120])
        tally.text.append(" ".join(statement.split()))

    sa.event.listen(db.engine, "after_cursor_execute", after)
    try:
        yield tally
    finally:
        sa.event.remove(db.engine, "after_cursor_execute", after)


def cluster(db: Database, nodes: int, jobs: int | None = None) -> None:
    """``nodes`` nodes of ``GPUS`` GPUs, each node running a job (or one of ``jobs`` jobs, each on many nodes),
    ``ROUNDS`` rounds ``STEP_S`` apart."""
    writer = Writer(db)
    for k in range(ROUNDS):
        t = T0 + k * STEP_S
        writer.write(
            [
                snapshot(f"node-{n:03d}", t, gpus=GPUS, job=f"job-{n if jobs is None else n % jobs}")
                for n in range(nodes)
            ]
        )


def node_page_reads(reader: SqlReader, node: str) -> Callable[[], object]:
    """What the node page reads for one node (gpulens.dashboard.gpuview.load_gpu_view with ``node=``)."""

    def read() -> object:
        readings = reader.latest_readings(node=node)
        uuids = [r.uuid for r in readings]
        jobs, processes = reader.current_jobs(node=node), reader.current_processes(node=node)
        assert {j.node for j in jobs} == {node}  # the node's own job, never the cluster's
        return readings, jobs, processes, reader.series(uuids, FIELDS, T0, T0 + ROUNDS * STEP_S, 500)

    return read


def measure(
    db_url: str, nodes: int, read: Callable[[SqlReader], Callable[[], object]], jobs: int | None = None
) -> Tally:
    """What ``read`` reads on a store of ``nodes`` nodes: each node its own job, or one of ``jobs`` jobs."""
    db = Database(db_url, clock=ManualClock(T0 + ROUNDS * STEP_S))
    try:
        db.upgrade()
        cluster(db, nodes, jobs)
        reader = SqlReader(db)
        load = read(reader)
        load()  # warm: any one-time lookups (schema, inventory caches) are not part of a page view
        with counting(db) as tally:
            load()
        return tally
    finally:
        db.close()


@contextmanager
def fresh_store(db_url: str, tmp_path: Any, request: Any, name: str) -> Iterator[str]:
    """The URL of a new, empty store on the same backend as ``db_url`` (one per cluster size)."""
    if db_url.startswith("sqlite"):
        yield f"sqlite:///{tmp_path}/{name}.db"
        return
    server = request.getfixturevalue("pg_server")
    database = server.create_database()
    try:
        yield server.url(database)
    finally:
        server.drop_database(database)


def test_node_page_reads_one_node_whatever_the_cluster_size(db_url: str, tmp_path: Any, request: Any) -> None:
    tallies = {}
    for nodes in (10, 50):
        with fresh_store(db_url, tmp_path, request, f"bounds-{nodes}") as url:
            tallies[nodes] = measure(url, nodes, lambda reader: node_page_reads(reader, "node-003"))
    small, large = tallies[10], tallies[50]
    assert small.statements >= 4, small.seen  # the readings, jobs, processes and series were read through SQL
    assert large.statements == small.statements, (small.seen, large.seen)
    # One node's readings and series: the same rows on either cluster, at most one row per GPU per round and field
    # group, never the other nodes' GPUs.
    assert large.rows == small.rows, (small.rows, large.rows)
    assert small.rows <= GPUS * (ROUNDS + 1) * 2 + 2 * GPUS, small.rows
    assert small.rows >= GPUS, small.rows


def test_counting_sees_rows_that_grow_with_the_cluster(db_url: str, tmp_path: Any, request: Any) -> None:
    """The check above can fail: reading every GPU's latest reading returns rows in proportion to the cluster."""
    tallies = {}
    for nodes in (10, 50):
        with fresh_store(db_url, tmp_path, request, f"all-{nodes}") as url:
            tallies[nodes] = measure(url, nodes, lambda reader: reader.latest_readings)
    assert tallies[10].statements == tallies[50].statements
    assert tallies[10].rows == 10 * GPUS
    assert tallies[50].rows == 50 * GPUS


def test_jobs_page_reads_the_per_job_aggregate_whatever_the_cluster_size(
    db_url: str, tmp_path: Any, request: Any
) -> None:
    """The jobs page's figures come from the aggregate the writer keeps (one row per job and minute), not from the
    samples or rollups of every GPU: with the same 4 jobs on 10 or 50 nodes, the statements are the same, the rows
    differ only by the allocations (one per GPU, which name the job's GPUs and nodes), and the aggregate holds one row
    per job and minute whatever the number of GPUs."""
    tallies, aggregate_rows = {}, {}
    for nodes in (10, 50):
        with fresh_store(db_url, tmp_path, request, f"jobs-{nodes}") as url:
            tallies[nodes] = measure(url, nodes, lambda reader: lambda: reader.jobs(T0, T0 + ROUNDS * STEP_S), jobs=4)
            counter = Database(url)
            with counter.session() as session:
                aggregate_rows[nodes] = session.execute(sa.text("SELECT count(*) FROM job_minute")).scalar_one()
            counter.close()
    small, large = tallies[10], tallies[50]
    assert large.statements == small.statements >= 2, (small.seen, large.seen)
    assert any("FROM job_minute" in text for text in small.text), small.seen
    assert not any("gpu_rollup" in text for text in small.text + large.text), small.seen
    # gpu_sample only in the allocations' seek of each open one's newest sample (schema.newest_sample_ms), never joined
    assert not any("JOIN gpu_sample" in text for text in small.text + large.text), small.seen
    assert large.rows - small.rows == (50 - 10) * GPUS, (small.rows, large.rows)
    minutes = len({int(T0 + k * STEP_S) // 60 for k in range(ROUNDS)})
    assert aggregate_rows[10] == aggregate_rows[50] == 4 * minutes
