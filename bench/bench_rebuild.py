"""The rollup rebuild on SQLite and PostgreSQL: every 1-minute and 1-hour rollup row of HOURS of NODES x GPUS
recomputed from the raw samples.

For each backend: build the history as ``bench.bench_storage`` does (generated inside the database, in time order),
then time the rebuild two ways on the same store: the collector's own catch-up (``Rollups.run`` from an empty tier,
ten minutes of all GPUs per transaction: the way to rebuild before ``storage.rebuild``) and ``storage.rebuild.rebuild``
(an hour per transaction). Each prints its seconds and raw rows per second; the rollup rows of the two are compared.
Progress goes to stderr; stdout has one ``name: value unit`` per line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa

from bench import options
from bench.bench_storage import START, _history_sql, _profiles_sql, _round, each_backend, emit, log
from gpulens.clock import ManualClock
from gpulens.storage import jobminute, rebuild, schema
from gpulens.storage.db import Database
from gpulens.storage.rollup import Rollups
from gpulens.storage.writer import Writer


def _build(db: Database, args: argparse.Namespace, prefix: str) -> float:
    """The history; returns its end (seconds)."""
    import random

    end = START + args.hours * 3600
    Writer(db).write(_round(args.nodes, args.gpus, START - args.interval, random.Random(7)))
    rounds = round(args.hours * 3600 / args.interval)
    log(f"{prefix}: generating {rounds * args.nodes * args.gpus:,} sample rows")
    db.ensure_partitions("gpu_sample", range(round(START * 1000), round(end * 1000) + 1, schema.DAY_MS))
    with db.write_transaction() as conn:
        conn.execute(sa.text(_profiles_sql()))
    history = sa.text(_history_sql(db.dialect, round(args.interval * 1000)))
    chunk = max(1, round(3600 / args.interval))
    for k0 in range(0, rounds, chunk):
        with db.write_transaction() as conn:
            conn.execute(history, {"k0": k0, "k1": min(rounds, k0 + chunk)})
    with db.write_transaction() as conn:  # as the writer keeps it
        conn.execute(sa.update(schema.gpu).values(last_seen_ms=round((end - args.interval) * 1000)))
    if db.dialect == "postgresql":
        with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE")
    return end


def _reset(db: Database) -> None:
    """No rollup rows, both tiers back at the start."""
    with db.write_transaction() as conn:
        for table in ("gpu_rollup_1m", "gpu_rollup_1h"):
            conn.exec_driver_sql(f"DELETE FROM {table}")
        t = schema.tier_state
        conn.execute(sa.update(t).where(t.c.tier.in_(["1m", "1h"])).values(position_ms=None))
    if db.dialect == "postgresql":  # the deleted rows' cleanup is not the next measurement's
        with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE")


def _rows(db: Database) -> list[tuple[object, ...]]:
    with db.session() as session:
        return [
            tuple(row)
            for table in ("gpu_rollup_1m", "gpu_rollup_1h")
            for row in session.execute(sa.text(f"SELECT * FROM {table} ORDER BY gpu_id, ts_ms"))
        ]


def _server_cpu(db: Database) -> float:
    """CPU seconds of the PostgreSQL server so far (its processes, live and exited); 0 on SQLite."""
    if db.dialect != "postgresql":
        return 0.0
    with db.session() as session:
        data = session.execute(sa.text("SHOW data_directory")).scalar_one()
    postmaster = (Path(data) / "postmaster.pid").read_text().split()[0]
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = stat.parent.name, fields[1]
        if pid == postmaster:
            total += sum(int(x) for x in fields[11:15])  # its own and its reaped children's
        elif ppid == postmaster:
            total += int(fields[11]) + int(fields[12])
    return total / tick


def _timed(db: Database, prefix: str, name: str, raw_rows: int, work: Callable[[], object]) -> None:
    """Wall and CPU seconds (this process and the server) of ``work``: the machine is shared, CPU is the steadier."""
    cpu0, server0, started = time.process_time(), _server_cpu(db), time.perf_counter()
    work()
    seconds = time.perf_counter() - started
    cpu = time.process_time() - cpu0 + _server_cpu(db) - server0
    emit(f"{prefix}_{name}", seconds, "s")
    emit(f"{prefix}_{name}_cpu", cpu, "CPU-s")
    emit(f"{prefix}_{name}_rate", raw_rows / seconds, "raw rows/s")


def run_backend(prefix: str, url: str, args: argparse.Namespace) -> None:
    end = START + args.hours * 3600
    db = Database(url, clock=ManualClock(end))
    db.upgrade()
    end = _build(db, args, prefix)
    raw_rows = round(args.hours * 3600 / args.interval) * args.nodes * args.gpus
    _reset(db)
    log(f"{prefix}: rebuilding with Rollups.run")
    _timed(db, prefix, "rollup_run_rebuild", raw_rows, lambda: Rollups(db, settle_s=0).run(end))
    before = _rows(db)
    _reset(db)
    log(f"{prefix}: rebuilding with storage.rebuild ({args.chunk_minutes}-minute chunks)")

    def report(p: rebuild.Progress) -> None:
        if p.chunks_done % 6 == 0 or p.chunks_done == p.chunks_total:
            log(f"{prefix}:   {p.chunks_done}/{p.chunks_total} chunks, {p.rows:,} rows, {p.elapsed_s:.0f} s")

    _timed(
        db,
        prefix,
        "rollup_rebuild",
        raw_rows,
        lambda: rebuild.rebuild(db, START - 3600, end, chunk_minutes=args.chunk_minutes, progress=report),
    )
    after = _rows(db)
    if after != before:
        raise RuntimeError(f"{prefix}: the rebuild's rollup rows differ from Rollups.run's")

    def job_minutes() -> None:  # the part of the rebuild that Rollups.run leaves to the writer
        with db.write_transaction() as conn:
            jobminute.recompute(conn, db.dialect, range(round(START * 1000), round(end * 1000), schema.MINUTE_MS))

    _timed(db, prefix, "job_minutes_recompute", raw_rows, job_minutes)
    db.close()


def whole_hours(text: str) -> int:
    try:
        hours = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a whole number of hours (the rebuild covers whole hours)"
        ) from None
    if hours < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: at least 1 hour")
    return hours


def main() -> int:
    parser = options.parser("bench.bench_rebuild", __doc__, "", "--nodes 100 --hours 1 --backends sqlite")
    parser.add_argument("--nodes", type=int, default=1000, help="simulated nodes (default 1000)")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    # whole hours: the rebuild covers whole hours, so a part hour's rows could not be compared with the live ones
    parser.add_argument("--hours", type=whole_hours, default=24, help="hours of history, a whole number (default 24)")
    parser.add_argument("--interval", type=float, default=10, help="seconds between rounds (default 10)")
    parser.add_argument("--chunk-minutes", type=int, default=rebuild.DEFAULT_CHUNK_MINUTES, help="rebuild chunk")
    parser.add_argument("--backends", default="sqlite,postgresql", help="comma-separated (default: both)")
    parser.add_argument("--dir", type=Path, default=None, help="where to build the stores (default: a temp dir)")
    args = parser.parse_args()
    each_backend(args.backends, run_backend, args, "gpulens-bench-", args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
