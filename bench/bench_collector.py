"""One collector scrape round of a simulated 1,000-node x 8-GPU cluster: fetch 1,000 snapshots over HTTP from an
`--all-nodes` exporter process, parse and check them, write them to SQLite in one transaction. Target (issue 13):
<= 1 s wall and <= 0.5 CPU-second (the collector process's CPU, the exporter runs in its own process; no alert
engine). The collector asks for the columnar snapshot with only the inactive links; `_rows` figures make the exporter
ignore the request, as an older exporter does (the row layout, every link). Also the decode alone: CPU per document
of `snapshot_from_bytes`, each layout.
"""

from __future__ import annotations

import dataclasses
import gc
import gzip
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench import options
from bench.bench_sim import scenario_text
from bench.bench_sim_serve import free_port, wait_ready
from gpulens.collector import scrape
from gpulens.collector.loop import Collector
from gpulens.gcpause import tune_garbage_collector
from gpulens.settings import TargetSettings, default_settings
from gpulens.snapshotcodec import snapshot_from_bytes
from gpulens.storage.db import Database

ROUNDS = 3
DOCUMENTS = {  # figure name -> the snapshot's query
    "rows": "layout=rows",
    "columnar": "layout=columnar",
    "columnar_inactive_links": "layout=columnar&links=inactive",  # what the collector asks for
}


def main() -> None:
    options.no_arguments(__spec__.name if __spec__ else __name__, __doc__)
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
            figures = {"_default_gc": _rounds(settings, db)}
            tune_garbage_collector()  # as `gpulens collector` does after start-up
            figures[""] = _rounds(settings, db)
            query = scrape.SNAPSHOT_QUERY
            scrape.SNAPSHOT_QUERY = "layout-ignored=1"  # what an older exporter sees: nothing it knows
            try:
                figures["_rows"] = _rounds(settings, db)
            finally:
                scrape.SNAPSHOT_QUERY = query
            decode = {name: _decode_cpu(port, query) for name, query in DOCUMENTS.items()}
            db.close()
        finally:
            exporter.send_signal(signal.SIGINT)
            exporter.wait(timeout=30)
    for suffix, (walls, cpus, gcs) in figures.items():
        print(f"collector_round_1000x8_sqlite{suffix}_wall: {min(walls):.2f} s")
        print(f"collector_round_1000x8_sqlite{suffix}_cpu: {min(cpus):.2f} s")
        print(f"collector_round_1000x8_sqlite{suffix}_wall_median: {statistics.median(walls):.2f} s")
        print(f"collector_round_1000x8_sqlite{suffix}_cpu_median: {statistics.median(cpus):.2f} s")
        print(f"collector_round_1000x8_sqlite{suffix}_gc_median: {statistics.median(gcs):.2f} s")
    for name, (per_doc, size) in decode.items():
        print(f"snapshot_decode_{name}: {per_doc * 1e6:.0f} us per document ({size} bytes, 8 GPUs, 144 links)")


def _rounds(settings: object, db: Database) -> tuple[list[float], list[float], list[float]]:
    """Wall, CPU and garbage-collector seconds of each measured round (the collector keeps a round's records until
    the next, so each round's ~170,000 new records are what the cyclic collector walks over and over)."""
    collector = Collector(settings, db)  # type: ignore[arg-type]
    walls, cpus, gcs = [], [], []
    in_gc = [0.0, 0.0]  # start of the running collection, seconds in collections so far

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            in_gc[0] = time.perf_counter()
        else:
            in_gc[1] += time.perf_counter() - in_gc[0]

    gc.callbacks.append(on_gc)
    try:
        print("# warm-up round (the exporter renders every node once)", file=sys.stderr, flush=True)
        collector.run_round()
        for _ in range(ROUNDS):
            cpu0, wall0, gc0 = time.process_time(), time.perf_counter(), in_gc[1]
            result = collector.run_round()
            walls.append(time.perf_counter() - wall0)
            cpus.append(time.process_time() - cpu0)
            gcs.append(in_gc[1] - gc0)
            assert result.written
            assert sum(len(s.gpus) for s in result.snapshots) == 8000
    finally:
        gc.callbacks.remove(on_gc)
        collector.close()
    return walls, cpus, gcs


def _decode_cpu(port: int, query: str) -> tuple[float, int]:
    """CPU seconds per document to decode and type-check 1,000 nodes' snapshots asked for with ``query`` (median
    of 3), and the mean size of a document."""
    bodies = []
    for i in range(1000):
        url = f"http://127.0.0.1:{port}/node/node-{i:03d}/api/v1/snapshot?{query}"
        request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(request, timeout=30) as response:
            bodies.append(gzip.decompress(response.read()))
    runs = []
    for _ in range(3):
        cpu0 = time.process_time()
        for body in bodies:
            snapshot_from_bytes(body)
        runs.append(time.process_time() - cpu0)
    return statistics.median(runs) / len(bodies), sum(map(len, bodies)) // len(bodies)


if __name__ == "__main__":
    main()
