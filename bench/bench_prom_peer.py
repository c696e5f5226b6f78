"""Side by side: gpulens's collector and SQLite store against a real Prometheus, on the same simulated exporters.

One ``--all-nodes`` simulator process serves ``--nodes`` nodes x 8 GPUs. The collector (``gpulens collector``: its
alert engine included, into SQLite) and Prometheus (Debian's package) scrape every node every ``--interval`` seconds,
both running at once. After ``--warm`` seconds, each process's CPU (utime + stime from /proc/<pid>/stat) is read
over ``--minutes``; CPU per round is that divided by the rounds: the collector's own count of finished rounds,
and window / interval for Prometheus (which scrapes each target on its schedule).

Then, on the same data:
- bytes per sample: Prometheus's WAL and head chunks over the samples it appended, and the block a TSDB snapshot
  (the head compacted, admin API) takes; gpulens's ``gpu_sample`` and ``gpu_profile`` tables and indexes (dbstat)
  over its non-null values (rows x value columns that hold a value, a row's profile values counted as its own);
- "latest of every GPU": PromQL instant query ``{__name__=~"gpulens_gpu_.+"}`` against ``SqlReader.latest_readings``;
- "one GPU over the range": PromQL ``query_range`` of the dashboard's chart fields for one uuid at the scrape step
  against ``SqlReader.series`` of the same fields, asked for as many points as the step gives (medians of
  ``RANGE_REPEAT``).
Usage: ``python -m bench.bench_prom_peer [--nodes 100] [--minutes 3] [--interval 10]``; ``--nodes 1000`` for the
issue's figure.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from bench import options
from tests.conftest import free_port

REPEAT = 5
RANGE_REPEAT = 25  # the one-GPU range queries take about a millisecond: more repeats for a steadier median
TICKS = os.sysconf("SC_CLK_TCK")


def scenario(names: list[str]) -> str:
    """The simulator's cluster: ``names`` x 8 GPUs, a training job on every node."""
    listed = ", ".join(f'"{n}"' for n in names)
    lines = ["[cluster]", f"nodes = [{listed}]", "gpus_per_node = 8", "seed = 3", 'duration = "4h"', 'step = "10s"']
    for j in range(len(names) // 8):
        gpus = ", ".join(f'"{n}"' for n in names[8 * j : 8 * j + 8])
        lines += ["[[jobs]]", f'id = "train-{j}"', 'user = "u"', 'kind = "training"', f"gpus = [{gpus}]"]
    return "\n".join(lines) + "\n"


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def get(url: str, timeout: float = 120.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return bytes(response.read())


def wait_http(url: str, proc: subprocess.Popen[bytes], what: str, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            get(url, timeout=5)
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start") from None
            time.sleep(0.5)


def median_ms(function: Callable[[], Any], repeat: int = REPEAT) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        function()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1000


def prometheus_config(port: int, names: list[str], interval: float) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": f"{interval:.0f}s", "scrape_timeout": f"{interval:.0f}s"},
        "scrape_configs": [
            {
                "job_name": "gpulens",
                "static_configs": [
                    {"targets": [f"127.0.0.1:{port}"], "labels": {"__metrics_path__": f"/node/{n}/metrics"}}
                    for n in names
                ],
            }
        ],
    }


def collector_config(port: int, names: list[str]) -> str:
    return "".join(f'[[targets]]\nurl = "http://127.0.0.1:{port}/node/{n}"\nname = "{n}"\n\n' for n in names)


def prom_samples_appended(base: str) -> float:
    text = get(f"{base}/metrics").decode()
    match = re.search(r"^prometheus_tsdb_head_samples_appended_total(?:\{[^}]*\})? (\S+)$", text, re.M)
    return float(match.group(1)) if match else float("nan")


def collector_rounds(port: int) -> float:
    """Rounds the collector has finished (its round-duration histogram's count, on its own /metrics)."""
    text = get(f"http://127.0.0.1:{port}/metrics").decode()
    match = re.search(r"^gpulens_collector_round_duration_seconds_count(?:\{[^}]*\})? (\S+)$", text, re.M)
    return float(match.group(1)) if match else float("nan")


def gpulens_bytes_per_value(url: str) -> tuple[float, int, int]:
    """(bytes of gpu_sample, gpu_profile and their indexes, rows, non-null values) in the collector's SQLite file."""
    import sqlalchemy as sa

    from bench.bench_storage import _sample_bytes
    from gpulens.storage import schema
    from gpulens.storage.db import Database

    db = Database(url)
    try:
        size = _sample_bytes(db)
        with db.session() as session:
            columns = [
                row[1]
                for table in ("gpu_sample", "gpu_profile")
                for row in session.execute(sa.text(f"PRAGMA table_info({table})"))
            ]
            keys = ("gpu_id", "ts_ms", "profile_id", "key", schema.MINUTE, schema.MS)  # SQLite's stored time too
            values = [c for c in columns if c not in keys]
            counted = ", ".join(f"count({c})" for c in values)
            source = schema.sample_source(db.dialect)  # each row's profile values count as the row's
            row = session.execute(sa.text(f"SELECT count(*), {counted} FROM {source}")).one()
    finally:
        db.close()
    return size, int(row[0]), int(sum(row[1:]))


def main() -> int:
    parser = options.parser("bench.bench_prom_peer", __doc__, "", "--nodes 1000 --minutes 15")
    parser.add_argument("--nodes", type=int, default=100, help="simulated nodes of 8 GPUs (default 100)")
    parser.add_argument("--minutes", type=float, default=3.0, help="measurement window (default 3)")
    parser.add_argument("--interval", type=float, default=10.0, help="scrape interval, seconds (default 10)")
    parser.add_argument("--warm", type=float, default=40.0, help="seconds before measuring (default 40)")
    parser.add_argument("--prometheus", default="prometheus", help="the Prometheus binary (default: on PATH)")
    args = parser.parse_args()
    from gpulens.dashboard.panels import FIELDS
    from gpulens.metriccatalogue import GPU_FIELDS
    from gpulens.storage.db import Database
    from gpulens.storage.sqlreader import SqlReader

    work = Path(tempfile.mkdtemp(prefix="gpulens-bench-prompeer-"))
    names = [f"node-{n:04d}" for n in range(args.nodes)]
    (work / "cluster.toml").write_text(scenario(names))
    port, prom_port, coll_port = free_port(), free_port(), free_port()
    (work / "prometheus.yml").write_text(yaml.safe_dump(prometheus_config(port, names, args.interval)))
    (work / "gpulens.toml").write_text(collector_config(port, names))
    db_url = f"sqlite:///{work / 'gpulens.db'}"
    quiet = subprocess.DEVNULL
    cli = [sys.executable, "-m", "gpulens.cli"]
    procs: dict[str, subprocess.Popen[bytes]] = {}
    base = f"http://127.0.0.1:{prom_port}"
    try:
        procs["exporter"] = subprocess.Popen(
            [*cli, "exporter", "--source", "sim", "--scenario", str(work / "cluster.toml"), "--all-nodes",
             "--listen", f"127.0.0.1:{port}", "--log-level", "warning"], stdout=quiet, stderr=quiet,
        )  # fmt: skip
        wait_http(f"http://127.0.0.1:{port}/node/{names[0]}/metrics", procs["exporter"], "the simulator")
        log = (work / "prometheus.log").open("wb")
        procs["prometheus"] = subprocess.Popen(
            [args.prometheus, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}", "--web.enable-admin-api"], stdout=log, stderr=log,
        )  # fmt: skip
        procs["collector"] = subprocess.Popen(
            [*cli, "collector", "--config", str(work / "gpulens.toml"), "--db", db_url, "--interval",
             f"{args.interval:g}s", "--listen", f"127.0.0.1:{coll_port}", "--spool-dir", str(work / "spool"),
             "--log-level", "warning"], stdout=quiet, stderr=(work / "collector.log").open("wb"),
        )  # fmt: skip
        wait_http(f"{base}/-/ready", procs["prometheus"], "Prometheus")
        print(f"# {args.nodes} nodes: warming {args.warm:.0f} s, then {args.minutes:g} min", file=sys.stderr)
        time.sleep(args.warm)
        for name in ("collector", "prometheus"):
            if procs[name].poll() is not None:
                raise RuntimeError(f"{name} exited: see {work}")
        window = args.minutes * 60
        start = {name: cpu_seconds(procs[name].pid) for name in ("collector", "prometheus")}
        rounds_before = collector_rounds(coll_port)
        began_at = time.time()
        time.sleep(window)
        # Prometheus scrapes every target on its schedule; the collector's rounds are counted (a round that overran
        # the interval delays the next).
        rounds = {"prometheus": window / args.interval, "collector": collector_rounds(coll_port) - rounds_before}
        cpu = {name: (cpu_seconds(procs[name].pid) - start[name]) / max(rounds[name], 1) for name in start}
        loadavg = os.getloadavg()[0]

        # Queries, both stores holding the same minutes.
        reader = SqlReader(Database(db_url))
        uuid = reader.latest_readings(node=names[0])[0].uuid
        end = time.time()
        families = sorted({s.family for s in GPU_FIELDS if s.field in FIELDS})
        latest_q = urllib.parse.urlencode({"query": '{__name__=~"gpulens_gpu_.+"}'})
        range_q = urllib.parse.urlencode({
            "query": f'{{__name__=~"{"|".join(families)}",uuid="{uuid}"}}', "start": f"{began_at:.3f}",
            "end": f"{end:.3f}", "step": f"{args.interval:g}",
        })  # fmt: skip
        steps = int((end - began_at) // args.interval) + 1  # query_range's points per series: as many asked of gpulens
        latest_doc = json.loads(get(f"{base}/api/v1/query?{latest_q}"))
        range_doc = json.loads(get(f"{base}/api/v1/query_range?{range_q}"))
        q = {
            "latest_prometheus": median_ms(lambda: get(f"{base}/api/v1/query?{latest_q}")),
            "latest_gpulens": median_ms(lambda: reader.latest_readings()),
            "range_prometheus": median_ms(lambda: get(f"{base}/api/v1/query_range?{range_q}"), RANGE_REPEAT),
            "range_gpulens": median_ms(lambda: reader.series([uuid], FIELDS, began_at, end, steps), RANGE_REPEAT),
        }
        gpus_read = len(reader.latest_readings())
        reader.db.close()

        # Bytes: stop the collector (its file is final), snapshot Prometheus's head into a block.
        procs["collector"].send_signal(signal.SIGINT)
        procs["collector"].wait(timeout=60)
        appended = prom_samples_appended(base)
        request = urllib.request.Request(f"{base}/api/v1/admin/tsdb/snapshot", method="POST")
        with urllib.request.urlopen(request, timeout=300) as response:
            snapshot_name = json.loads(response.read())["data"]["name"]
        block = dir_bytes(work / "tsdb" / "snapshots" / snapshot_name)
        head = dir_bytes(work / "tsdb" / "wal") + dir_bytes(work / "tsdb" / "chunks_head")
        size, rows, values = gpulens_bytes_per_value(db_url)
    finally:
        for name, proc in procs.items():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT if name != "prometheus" else signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    shutil.rmtree(work, ignore_errors=True)  # kept only when a run fails, to read the logs
    gpus = args.nodes * 8
    tag = f"{args.nodes}x8"
    print(f"prompeer_load_average_{tag}: {loadavg:.1f}")
    print(f"prompeer_collector_cpu_per_round_{tag}: {cpu['collector']:.3f} CPU-s (alert engine and SQLite included; "
          f"{rounds['collector']:.0f} rounds of {rounds['prometheus']:.0f} intervals)")  # fmt: skip
    print(f"prompeer_prometheus_cpu_per_round_{tag}: {cpu['prometheus']:.3f} CPU-s")
    print(f"prompeer_ratio_cpu_per_round_{tag}: {cpu['collector'] / cpu['prometheus']:.2f} gpulens/Prometheus")
    per_value = size / max(values, 1)
    per_sample_block = block / appended
    print(f"prompeer_gpulens_bytes_per_value_{tag}: {per_value:.2f} B ({size / max(rows, 1):.0f} B per GPU row, "
          f"{values / max(rows, 1):.1f} values per row, {rows} rows)")  # fmt: skip
    print(f"prompeer_prometheus_bytes_per_sample_block_{tag}: {per_sample_block:.2f} B ({appended:.0f} samples)")
    print(f"prompeer_prometheus_bytes_per_sample_wal_head_{tag}: {head / appended:.2f} B")
    print(f"prompeer_ratio_bytes_per_sample_{tag}: {per_value / per_sample_block:.2f} gpulens/Prometheus (block)")
    print(f"prompeer_prometheus_latest_every_gpu_{tag}: {q['latest_prometheus']:.1f} ms "
          f"({len(latest_doc['data']['result'])} series)")  # fmt: skip
    print(f"prompeer_gpulens_latest_every_gpu_{tag}: {q['latest_gpulens']:.1f} ms ({gpus_read} of {gpus} GPUs)")
    print(f"prompeer_ratio_latest_every_gpu_{tag}: {q['latest_gpulens'] / q['latest_prometheus']:.2f} "
          "gpulens/Prometheus")  # fmt: skip
    points = sum(len(r["values"]) for r in range_doc["data"]["result"])
    print(f"prompeer_prometheus_one_gpu_range_{tag}: {q['range_prometheus']:.2f} ms ({len(families)} families, "
          f"{points} points)")  # fmt: skip
    print(f"prompeer_gpulens_one_gpu_range_{tag}: {q['range_gpulens']:.2f} ms ({len(FIELDS)} fields, at most "
          f"{steps} points each, as query_range's step)")  # fmt: skip
    print(f"prompeer_ratio_one_gpu_range_{tag}: {q['range_gpulens'] / q['range_prometheus']:.2f} gpulens/Prometheus")
    return 0


if __name__ == "__main__":
    sys.exit(main())
