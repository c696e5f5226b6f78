"""The dashboard over Prometheus: queries, series and time per page for a simulated cluster of ``NODES`` x 8 GPUs.

One ``--all-nodes`` exporter serves the cluster; a real Prometheus (Debian's package) scrapes every node every
``SCRAPE_S`` seconds; after ``WARM_S`` seconds each page's data loading runs (the page's render function with a
``PromReader``, as the dashboard calls it) over the last 15 minutes. Printed per page: PromQL queries, series
returned, and milliseconds (the median of ``REPEAT`` loads). Usage: ``python -m bench.bench_prometheus [NODES]``.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

NODES = 50
SCRAPE_S = 5
WARM_S = 60
REPEAT = 5


def scenario(names: list[str]) -> str:
    listed = ", ".join(f'"{n}"' for n in names)
    lines = ["[cluster]", f"nodes = [{listed}]", "gpus_per_node = 8", "seed = 3", 'duration = "4h"', 'step = "10s"']
    for j in range(len(names) // 8):
        gpus = ", ".join(f'"{n}"' for n in names[8 * j : 8 * j + 8])
        lines += ["[[jobs]]", f'id = "train-{j}"', 'user = "u"', 'kind = "training"', f"gpus = [{gpus}]"]
    return "\n".join(lines) + "\n"


def main() -> int:
    from dashboard.components import ViewState
    from dashboard.context import Context
    from dashboard.grid import DEFAULT_SORT
    from dashboard.heatmaps import DEFAULT_METRIC
    from dashboard.pages import gpu, interconnect, job, jobs, node, overview
    from gpulens.settings import StoreAuth
    from storage.prometheus import PromReader
    from tests.conftest import free_port
    from tests.prom import running_prometheus

    nodes = int(sys.argv[1]) if len(sys.argv) > 1 else NODES
    work = Path(tempfile.mkdtemp(prefix="gpulens-bench-prom-"))
    names = [f"node-{n:04d}" for n in range(nodes)]
    (work / "cluster.toml").write_text(scenario(names))
    port = free_port()
    exporter = subprocess.Popen(
        [sys.executable, "-m", "gpulens.cli", "exporter", "--source", "sim", "--scenario", str(work / "cluster.toml"),
         "--all-nodes", "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    jobs_ = {n: (f"127.0.0.1:{port}", f"/node/{n}/metrics") for n in names}
    try:
        time.sleep(3)
        (work / "prom").mkdir()
        with running_prometheus("prometheus", work / "prom", jobs_, interval_s=SCRAPE_S) as base:
            time.sleep(WARM_S)
            store = PromReader("prometheus+" + base, StoreAuth(min_step_s=SCRAPE_S))
            context = Context(db=store, clock=store.clock)
            state = ViewState(range="15m")
            some = store.latest_readings(node=names[0])[0].uuid
            pages: dict[str, Callable[[], Any]] = {
                "overview": lambda: overview.render(context, state, DEFAULT_METRIC, DEFAULT_SORT, "", 1),
                "jobs": lambda: jobs.render(context, state, "all", "", 1),
                "job": lambda: job.render(context, state, "train-0"),
                "node": lambda: node.render(context, state, names[0]),
                "gpu": lambda: gpu.render(context, state, some),
                "interconnect": lambda: interconnect.render(context, state, names[0]),
            }
            for name, load in pages.items():
                times = []
                for _ in range(REPEAT):
                    before = (store.client.stats.queries, store.client.stats.series)
                    began = time.perf_counter()
                    load()
                    times.append(time.perf_counter() - began)
                queries = store.client.stats.queries - before[0]
                series = store.client.stats.series - before[1]
                print(f"prometheus_{name}_page_{nodes * 8}_gpus: {statistics.median(times) * 1000:.0f} ms, "
                      f"{queries} queries, {series} series")  # fmt: skip
    finally:
        exporter.terminate()
        exporter.wait(timeout=20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
