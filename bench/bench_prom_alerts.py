"""The alert engine over Prometheus, side by side with Prometheus's own scraping: what one round of
``gpulens alerts run --db prometheus+http://...`` costs Prometheus, next to what scraping the same exporters costs it.

One ``--all-nodes`` simulator process serves ``--nodes`` nodes x 8 GPUs (training jobs of whole nodes); Prometheus
(Debian's package) scrapes every node every ``--interval`` seconds. After ``--warm`` seconds, Prometheus's CPU
(utime + stime from /proc/<pid>/stat) is read over ``--minutes`` with nothing else asking it anything: its scraping
CPU per interval. Then the engine's round runs every interval over as many minutes, in this process, two ways in
turn, each after an interval of rest (with ``--back-to-back``, one round after another): ``filtered``
(``promround.prom_round``: every GPU's round fields, the rest where a rule could fire), then ``whole``
(``store_round``: every field of every GPU), each followed by ``AlertEngine.process`` with every built-in rule.
Prometheus's CPU over a way's window less its scraping CPU, divided by the rounds, is that way's cost to Prometheus
per round; this process's CPU per round (decoding the answers and the rules) is the engine's own. The queries and
series each round reads come from the reader's own counters.

Usage: ``python -m bench.bench_prom_alerts [--nodes 100] [--minutes 2] [--interval 15]``.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from bench import options
from bench.bench_prom_peer import cpu_seconds, prometheus_config, scenario, wait_http
from tests.conftest import free_port


def main() -> int:
    parser = options.parser("bench.bench_prom_alerts", __doc__, "", "--nodes 1000 --minutes 3")
    parser.add_argument("--nodes", type=int, default=100, help="simulated nodes of 8 GPUs (default 100)")
    parser.add_argument("--minutes", type=float, default=2.0, help="each measurement window (default 2)")
    parser.add_argument("--interval", type=float, default=15.0, help="scrape and round interval, s (default 15)")
    parser.add_argument("--warm", type=float, default=45.0, help="seconds before measuring (default 45)")
    parser.add_argument(
        "--back-to-back", action="store_true", help="rounds one after another, not one per interval (more rounds)"
    )
    parser.add_argument("--prometheus", default="prometheus", help="the Prometheus binary (default: on PATH)")
    args = parser.parse_args()
    from gpulens.alerts.engine import AlertEngine
    from gpulens.alerts.promround import prom_round, round_reads, watched_gpus
    from gpulens.alerts.rules import builtin_rules
    from gpulens.alerts.storeround import store_round
    from gpulens.settings import StoreAuth
    from gpulens.storage.prometheus import PromReader
    from gpulens.storage.prometheus.alertread import GpuFacts

    work = Path(tempfile.mkdtemp(prefix="gpulens-bench-promalerts-"))
    names = [f"node-{n:04d}" for n in range(args.nodes)]
    (work / "cluster.toml").write_text(scenario(names))
    port, prom_port = free_port(), free_port()
    (work / "prometheus.yml").write_text(yaml.safe_dump(prometheus_config(port, names, args.interval)))
    cli = [sys.executable, "-m", "gpulens.cli"]
    procs: dict[str, subprocess.Popen[bytes]] = {}
    base = f"http://127.0.0.1:{prom_port}"
    window = args.minutes * 60
    try:
        procs["exporter"] = subprocess.Popen(
            [*cli, "exporter", "--source", "sim", "--scenario", str(work / "cluster.toml"), "--all-nodes",
             "--listen", f"127.0.0.1:{port}", "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_http(f"http://127.0.0.1:{port}/node/{names[0]}/metrics", procs["exporter"], "the simulator")
        log = (work / "prometheus.log").open("wb")
        procs["prometheus"] = subprocess.Popen(
            [args.prometheus, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"], stdout=log, stderr=log,
        )  # fmt: skip
        wait_http(f"{base}/-/ready", procs["prometheus"], "Prometheus")
        print(f"# {args.nodes} nodes: warming {args.warm:.0f} s, then 2 x {args.minutes:g} min", file=sys.stderr)
        time.sleep(args.warm)
        pid = procs["prometheus"].pid
        load_before = os.getloadavg()[0]
        began = cpu_seconds(pid)
        time.sleep(window)
        scrape_per_s = (cpu_seconds(pid) - began) / window

        store = PromReader("prometheus+" + base, StoreAuth(min_step_s=args.interval), timeout_s=120)
        rules = builtin_rules()
        max_age_s = max(3 * args.interval, 30.0)
        results = {}
        for way in ("filtered", "whole"):
            time.sleep(args.interval)  # what the previous window left to Prometheus (its garbage collection) settles
            engine = AlertEngine(rules)
            facts = GpuFacts(store, round_reads(rules).facts)
            own: list[float] = []
            queries: list[int] = []
            series: list[int] = []
            fired: set[str] = set()
            began, started = cpu_seconds(pid), time.monotonic()
            while time.monotonic() - started < window:
                at = time.monotonic()
                stats = store.client.stats
                before = (stats.queries, stats.series, time.process_time())
                if way == "whole":
                    result = store_round(store, time.time(), max_age_s=max_age_s)
                else:
                    watched = watched_gpus(engine.states)
                    result = prom_round(
                        store,
                        time.time(),
                        max_age_s=max_age_s,
                        rules=rules,
                        history=engine.history,
                        facts=facts,
                        watched=watched,
                    )
                engine.process(result.time, result.snapshots, result.targets)
                own.append(time.process_time() - before[2])
                queries.append(stats.queries - before[0])
                series.append(stats.series - before[1])
                fired |= {s.rule for s in engine.states.values() if s.state == "firing"}
                if not args.back_to_back:
                    time.sleep(max(0.0, args.interval - (time.monotonic() - at)))
            elapsed = time.monotonic() - started
            prom = (cpu_seconds(pid) - began - scrape_per_s * elapsed) / len(own)
            results[way] = (own, queries, series, fired, prom)
        load_after = os.getloadavg()[0]
        store.close()
        time.sleep(args.interval)
        began = cpu_seconds(pid)
        time.sleep(window)
        scrape_after = (cpu_seconds(pid) - began) / window * args.interval
    finally:
        for name, proc in procs.items():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT if name != "prometheus" else signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    shutil.rmtree(work, ignore_errors=True)
    tag = f"{args.nodes}x8"
    scrape = scrape_per_s * args.interval
    print(f"promalerts_load_average_{tag}: {load_before:.1f} before, {load_after:.1f} after (runnable)")
    print(
        f"promalerts_prometheus_scrape_cpu_per_interval_{tag}: {scrape:.3f} CPU-s ({args.interval:g} s; "
        f"{scrape_after:.3f} measured again after the rounds)"
    )
    for way, (own, queries, series, fired, prom) in results.items():
        print(f"promalerts_{way}_rounds_{tag}: {len(own)} rounds (firing: {', '.join(sorted(fired)) or 'none'})")
        print(f"promalerts_{way}_queries_per_round_{tag}: {statistics.median(queries):.0f} queries")
        print(f"promalerts_{way}_series_per_round_{tag}: {statistics.median(series):.0f} series")
        print(f"promalerts_{way}_prometheus_cpu_per_round_{tag}: {prom:.3f} CPU-s")
        print(f"promalerts_{way}_ratio_to_scrape_{tag}: {prom / scrape:.2f}")
        print(f"promalerts_{way}_engine_own_cpu_per_round_{tag}: {statistics.median(own):.3f} CPU-s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
