"""Schema upgrades that copy the sample table: the rows each backend copies per second, and the plan's estimate.

For each backend: build a store at the newest revision holding HOURS of NODES x GPUS samples (generated inside the
database, as bench_storage does), take it down to the revision before the migrations that copy ``gpu_sample``
(0009 on SQLite: 0010 and 0011 copy it; 0006 on PostgreSQL: 0007 and 0008 copy it), then time ``gpulens db
upgrade`` to the newest. Prints the rows ``gpulens db upgrade --plan`` said would be copied, its estimate, the time
the upgrade took, and the rate it measured: ``upgradeplan.COPY_ROWS_PER_S`` holds these rates.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

import sqlalchemy as sa

from bench import options
from bench.bench_storage import START, _history_sql, _profiles_sql, _round, each_backend, emit, log
from gpulens.clock import ManualClock
from gpulens.storage.db import Database
from gpulens.storage.upgradeplan import plan
from gpulens.storage.writer import Writer
from tests.storage.data import downgrade

BEFORE_THE_COPIES = {"sqlite": "0009", "postgresql": "0006"}


def run_backend(prefix: str, url: str, args: argparse.Namespace) -> None:
    interval_ms = round(args.interval * 1000)
    rounds = round(args.hours * 3600 / args.interval)
    end = START + args.hours * 3600
    db = Database(url, clock=ManualClock(end))
    db.upgrade()
    Writer(db).write(_round(args.nodes, args.gpus, START - args.interval, random.Random(7)))
    log(f"{prefix}: generating {rounds * args.nodes * args.gpus:,} sample rows")
    db.ensure_partitions("gpu_sample", range(round(START * 1000), round(end * 1000) + 1, 86_400_000))
    with db.write_transaction() as conn:
        conn.execute(sa.text(_profiles_sql()))
        conn.execute(sa.text(_history_sql(db.dialect, interval_ms)), {"k0": 0, "k1": rounds})
    revision = BEFORE_THE_COPIES[db.dialect]
    log(f"{prefix}: down to revision {revision}")
    downgrade(db, revision)
    if db.dialect == "postgresql":
        with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text("ANALYZE"))  # the plan reads the planner's row estimates
    steps = plan(db)
    copied = sum(s.rows_copied for s in steps)
    estimate = sum(s.seconds(db.dialect) for s in steps)
    log(f"{prefix}: upgrading to the newest revision")
    started = time.perf_counter()
    db.upgrade()
    took = time.perf_counter() - started
    emit(f"upgrade_{prefix}_rows_copied", copied, "rows")
    emit(f"upgrade_{prefix}_plan_estimate", estimate, "s")
    emit(f"upgrade_{prefix}_took", took, "s")
    emit(f"upgrade_{prefix}_copy_rate", copied / took, "rows/s")
    db.close()


def main() -> int:
    parser = options.parser("bench.bench_upgrade", __doc__, "", "--nodes 100 --hours 1 --backends sqlite")
    parser.add_argument("--nodes", type=int, default=100, help="simulated nodes (default 100)")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    parser.add_argument("--hours", type=float, default=6, help="hours of history (default 6)")
    parser.add_argument("--interval", type=float, default=10, help="seconds between rounds (default 10)")
    parser.add_argument("--backends", default="sqlite,postgresql", help="comma-separated (default: both)")
    args = parser.parse_args()
    each_backend(args.backends, run_backend, args, "gpulens-bench-upgrade-", None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
