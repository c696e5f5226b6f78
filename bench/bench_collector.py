"""One collector scrape round of a simulated 1,000-node x 8-GPU cluster: fetch 1,000 snapshots over HTTP from an
`--all-nodes` exporter process, parse and check them, write them to SQLite in one transaction. Target (issue 4):
<= 2 s wall and <= 1 CPU-second (the collector process's CPU, the exporter runs in its own process).
"""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_sim import scenario_text
from bench.bench_sim_serve import free_port, wait_ready
from collector.loop import Collector
from gpulens.settings import TargetSettings, default_settings
from storage.db import Database

ROUNDS = 3


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cluster.toml"
        path.write_text(scenario_text())
        port = free_port()
        exporter = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpulens.cli",
                "exporter",
                "--source",
                "sim",
                "--scenario",
                str(path),
                "--all-nodes",
                "--listen",
                f"127.0.0.1:{port}",
                "--speed",
                "0.05",
                "--log-level",
                "warning",
            ]
        )
        try:
            wait_ready(port)
            url = f"sqlite:///{Path(tmp) / 'bench.db'}"
            db = Database(url)
            db.upgrade()
            targets = tuple(
                TargetSettings(url=f"http://127.0.0.1:{port}/node/node-{i:03d}", name=f"node-{i:03d}")
                for i in range(1000)
            )
            settings = dataclasses.replace(
                default_settings(environ={}),
                db_url=url,
                targets=targets,
                concurrency=32,
                timeout_s=10.0,
                spool_dir=str(Path(tmp) / "spool"),
            )
            collector = Collector(settings, db)
            try:
                print("# warm-up round (the exporter renders every node once)", file=sys.stderr, flush=True)
                collector.run_round()
                walls, cpus = [], []
                for _ in range(ROUNDS):
                    cpu0, wall0 = time.process_time(), time.perf_counter()
                    result = collector.run_round()
                    walls.append(time.perf_counter() - wall0)
                    cpus.append(time.process_time() - cpu0)
                    assert result.written
                    assert sum(len(s.gpus) for s in result.snapshots) == 8000
            finally:
                collector.close()
                db.close()
        finally:
            exporter.send_signal(signal.SIGINT)
            exporter.wait(timeout=30)
    print(f"collector_round_1000x8_sqlite_wall: {min(walls):.2f} s")
    print(f"collector_round_1000x8_sqlite_cpu: {min(cpus):.2f} s")


if __name__ == "__main__":
    main()
