"""The PostgreSQL writer's insert of a round's GPU rows from its staging table, unchecked (as it is tried first) against
checked (each value's range checked in SQL: what the writer ran first before, and its fallback now), in one run.

A throwaway PostgreSQL server (bench_storage's) holds NODES x GPUS GPUs; each of ROUNDS rounds stages their readings
by binary COPY, as ``Writer`` does, then inserts them with one statement or the other, alternately, each round at
a new timestamp. Prints the median time of each statement and the ratio; ``gpu_sample``'s
bytes per row (heap and indexes of its partitions) after the rounds. Without PostgreSQL's binaries: nothing to run.
"""

from __future__ import annotations

import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa

from bench import options
from bench.bench_storage import START, _round, emit, log, pg_bindir, postgresql_server
from gpulens.clock import ManualClock
from gpulens.storage import pgsamples, schema, writer
from gpulens.storage.db import Database


def _sample_bytes(db: Database) -> float:
    with db.engine.connect() as conn:
        return float(
            conn.exec_driver_sql(
                "SELECT sum(pg_total_relation_size(i.inhrelid)) / (SELECT count(*) FROM gpu_sample) "
                "FROM pg_inherits i WHERE i.inhparent = 'gpu_sample'::regclass"
            ).scalar_one()
        )


def run(url: str, nodes: int, gpus: int, rounds: int) -> None:
    db = Database(url, clock=ManualClock(START + 3600))
    db.upgrade()
    w = writer.Writer(db)
    rng = random.Random(7)
    w.write(_round(nodes, gpus, START - 10, rng))  # registers the GPUs and the profile
    with db.session() as session:
        ids = {uuid: gpu_id for uuid, gpu_id in session.execute(sa.select(schema.gpu.c.uuid, schema.gpu.c.id))}
    readings = [r for s in _round(nodes, gpus, START, rng) for r in s.gpus]
    statements = {"checked": pgsamples.insert_sql(checked=True), "unchecked": pgsamples.INSERT}
    spent: dict[str, list[float]] = {name: [] for name in statements}
    for k in range(2 * rounds):
        ts = round(START * 1000) + (k + 1) * 10_000
        rows = [(*writer._READING_VALUES(r), ids[r.uuid], ts, 1, 0, None) for r in readings]
        name = "checked" if k % 2 else "unchecked"
        with db.write_transaction() as conn:
            pgsamples.stage(conn, rows)
            started = time.perf_counter()
            inserted = conn.exec_driver_sql(statements[name]).rowcount
            spent[name].append(time.perf_counter() - started)
        if inserted != len(rows):
            raise RuntimeError(f"{name}: {inserted} rows inserted of {len(rows)}")
    checked, unchecked = (statistics.median(spent[name]) * 1000 for name in ("checked", "unchecked"))
    emit("postgresql_round_insert_checked", checked, f"ms ({len(readings)} rows)")
    emit("postgresql_round_insert_unchecked", unchecked, f"ms ({len(readings)} rows)")
    emit("postgresql_round_insert_ratio", unchecked / checked, "x")
    emit("postgresql_sample_bytes_per_row", _sample_bytes(db), "bytes")
    db.close()


def main() -> int:
    parser = options.parser("bench.bench_pg_insert", __doc__, "", "--nodes 100 --rounds 5")
    parser.add_argument("--nodes", type=int, default=1000, help="simulated nodes (default 1000)")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    parser.add_argument("--rounds", type=int, default=10, help="rounds per statement (default 10)")
    args = parser.parse_args()
    bindir = pg_bindir()
    if bindir is None:
        log("postgresql: no server binaries under /usr/lib/postgresql, skipped")
        return 0
    root = Path(tempfile.mkdtemp(prefix="gpulens-bench-"))
    root.chmod(0o755)  # the PostgreSQL server, running as postgres, keeps its data in a subdirectory
    try:
        (root / "pg").mkdir()
        with postgresql_server(bindir, root / "pg") as url:
            run(url, args.nodes, args.gpus, args.rounds)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
