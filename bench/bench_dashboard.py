"""Dashboard benchmark: every page in headless Chromium over a store of 1,000 nodes x 8 GPUs and 24 hours of data.

The store is written through ``Writer.write`` (the collector's own write path) and rolled up with ``Rollups.run``.
Writing 24 h at the collector's 10 s interval would take about half an hour here, so by default the last hour is at
10 s (what 15 m and 1 h ranges read) and the 23 hours before it at 60 s (6 h, 24 h and 7 d ranges read 1-minute
rollups either way). Every GPU is in a 16-GPU job, with its processes; one job carries a firing stall alert.

Measured, for each page (median of 3 loads after one warm-up load, browser cache warm, as an operator's browser is):
the time from navigation to every chart drawn with the page's data. Then the slowest callback's server time over the
loads timed (and apart, over each page's first load, which warms the server too), and the largest callback payload
seen over all loads. Progress goes to stderr; stdout has one ``name: value unit`` per line.
The store is SQLite; ``--postgresql`` builds it in a throwaway PostgreSQL server instead (as ``bench_storage`` does).
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import logging
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from werkzeug.serving import make_server

from bench import options
from bench.bench_storage import pg_bindir, postgresql_server
from gpulens.alerts.state import AlertState
from gpulens.clock import ManualClock
from gpulens.dashboard.app import create_app
from gpulens.dashboard.webserve import CompressAndCache
from gpulens.gcpause import tune_garbage_collector
from gpulens.model import GpuJob, GpuReading, NodeSnapshot, ProcessReading
from gpulens.storage.db import Database
from gpulens.storage.rollup import Rollups
from gpulens.storage.writer import Writer
from tests.dashboard.browser import RENDERED_JS, chromium
from tests.dashboard.cluster import ReplayedAlerts
from tests.fakes.static_source import GIB, h100

END = 1_767_225_600.0  # 2026-01-01T00:00:00Z: "now" for the dashboard
JOB_GPUS = 16
VARIANTS = 64  # distinct value sets the GPUs cycle through, so that charts are not flat lines
_FIELDS = [f.name for f in dataclasses.fields(GpuReading)]
_IDENTITY = _FIELDS.index("timestamp")  # node, gpu, uuid, model come before it


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def emit(name: str, value: float, unit: str) -> None:
    print(f"{name}: {value:.1f} {unit}", flush=True)


# --- the store ------------------------------------------------------------------------------------------------------


class Cluster:
    """Readings for NODES x GPUS at any time, cheap enough to write millions: each GPU keeps its identity and takes
    one of ``VARIANTS`` value sets, a different one each round."""

    def __init__(self, nodes: int, gpus: int) -> None:
        rng = random.Random(7)
        self.names = [f"node-{n:04d}" for n in range(nodes)]
        self.identity = [
            [(name, i, f"GPU-{name}-{i:04d}-0000-0000-000000000000") for i in range(gpus)] for name in self.names
        ]
        self.values = [
            [
                tuple(
                    getattr(
                        h100(
                            "v",
                            i,
                            0.0,
                            utilization_ratio=round(rng.uniform(0.05, 1.0), 4),
                            power_watts=round(rng.uniform(90, 690), 1),
                            memory_used_bytes=rng.randrange(1, 80) * GIB,
                            temperature_celsius=round(rng.uniform(35, 85), 1),
                            nvlink_tx_bytes_per_second=rng.uniform(0, 2e11),
                            pcie_tx_bytes_per_second=rng.uniform(0, 2e10),
                        ),
                        f,
                    )
                    for f in _FIELDS[_IDENTITY + 1 :]
                )
                for i in range(gpus)
            ]
            for _ in range(VARIANTS)
        ]
        self.jobs = [
            tuple(GpuJob(node, i, uuid, f"job-{(n * gpus + i) // JOB_GPUS}", "alice") for node, i, uuid in gpus_)
            for n, gpus_ in enumerate(self.identity)
        ]
        self.processes = [
            tuple(
                ProcessReading(j.node, j.gpu, j.uuid, 4000 + j.gpu, 60 * GIB, "python", j.user, j.job_id) for j in jobs
            )
            for jobs in self.jobs
        ]

    def round(self, k: int, t: float) -> list[NodeSnapshot]:
        return [
            NodeSnapshot(
                node=name,
                timestamp=t,
                source="bench",
                gpus=tuple(
                    GpuReading(node, i, uuid, "NVIDIA H100 80GB HBM3", t, *self.values[(n + k) % VARIANTS][i])
                    for node, i, uuid in self.identity[n]
                ),
                jobs=self.jobs[n],
                processes=self.processes[n],
            )
            for n, name in enumerate(self.names)
        ]


def build(db: Database, cluster: Cluster, steps: Iterable[float]) -> int:
    writer = Writer(db)
    rows = 0
    started = time.perf_counter()
    for k, t in enumerate(steps):
        stats = writer.write(cluster.round(k, t))
        rows += stats.gpu_rows
        if k % 120 == 0:
            log(f"  {rows:,} rows written ({time.perf_counter() - started:.0f} s)")
    return rows


def timeline(hours: float, interval: float, recent_hours: float, recent_interval: float) -> list[float]:
    """Round times up to END: ``interval`` apart, the last ``recent_hours`` ``recent_interval`` apart."""
    recent_start = END - recent_hours * 3600
    old = [recent_start - i * interval for i in range(1, round((hours - recent_hours) * 3600 / interval) + 1)]
    recent = [recent_start + i * recent_interval for i in range(round(recent_hours * 3600 / recent_interval))]
    return sorted(old) + recent


def stall_alert(cluster: Cluster) -> ReplayedAlerts:
    """A firing stall on the first job, for the job page's marked period and the flags."""
    state = AlertState(
        fingerprint="bench-stall",
        rule="CommunicationStall",
        labels={"alertname": "CommunicationStall", "severity": "critical", "job_id": "job-0", "user": "alice"},
        annotations={"summary": f"job job-0: {JOB_GPUS} GPUs at 100% with no NVLink traffic for 20m"},
        state="firing",
        active_since=END - 1800,
        fired_at=END - 1200,
        last_seen=END,
    )
    return ReplayedAlerts([state], [state])


# --- serving with timing ------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Callbacks:
    """What the server saw of Dash callbacks: each one's server time and response size."""

    times_ms: list[float] = dataclasses.field(default_factory=list)
    payloads: list[int] = dataclasses.field(default_factory=list)
    outputs: list[str] = dataclasses.field(default_factory=list)  # each callback's output, as Dash names it
    first: list[bool] = dataclasses.field(default_factory=list)  # whether it came in a page's first (warm-up) load
    warming: bool = False  # whether the page being loaded now is in its first load


def timed(app: Callable[..., Any], seen: Callbacks) -> Callable[..., Any]:
    """WSGI middleware: time and size every ``/_dash-update-component`` request, body included."""

    def middleware(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterator[bytes]:
        started = time.perf_counter()
        callback = environ.get("PATH_INFO") == "/_dash-update-component"
        if callback:  # read the request here to learn its output; the app reads the copy
            size = int(environ.get("CONTENT_LENGTH") or 0)
            request = environ["wsgi.input"].read(size)
            environ["wsgi.input"] = io.BytesIO(request)
        body = b"".join(app(environ, start_response))
        if callback:
            seen.times_ms.append((time.perf_counter() - started) * 1000)
            seen.payloads.append(len(body))
            seen.outputs.append(str(json.loads(request or b"{}").get("output", "?"))[:60])
            seen.first.append(seen.warming)
        return iter([body])

    return middleware


@contextmanager
def serving(wsgi: Callable[..., Any]) -> Iterator[str]:
    server = make_server("127.0.0.1", 0, wsgi, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def measure(base: str, pages: dict[str, str], loads: int, seen: Callbacks) -> dict[str, float]:
    """Median milliseconds from navigation to rendered charts, per page (``seen`` told which loads warm up)."""
    results = {}
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1500, "height": 1000})
        page = context.new_page()
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        for name, path in pages.items():
            times = []
            for attempt in range(loads + 1):
                seen.warming = not attempt
                started = time.perf_counter()
                page.goto(base + path)
                page.wait_for_function(RENDERED_JS, timeout=120_000, polling=20)
                if attempt:  # the first load warms the browser cache
                    times.append((time.perf_counter() - started) * 1000)
            results[name] = statistics.median(times)
            log(f"  {name}: {results[name]:.0f} ms ({', '.join(f'{t:.0f}' for t in times)})")
        context.close()
        if errors:  # a page that failed may still count as drawn: its figures mean nothing
            raise SystemExit(f"console errors in the browser, figures not valid: {errors[:3]}")
    return results


def main() -> int:
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request would drown the progress
    parser = options.parser(
        "bench.bench_dashboard", __doc__, "", "--hours 3 --recent-hours 0.5 --keep", "--store /tmp/kept.db --loads 5"
    )
    parser.add_argument("--nodes", type=int, default=1000, help="simulated nodes (default 1000)")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    parser.add_argument("--hours", type=float, default=24, help="hours of history (default 24)")
    parser.add_argument("--interval", type=float, default=60, help="seconds between rounds before the last hour")
    parser.add_argument("--recent-hours", type=float, default=1, help="the newest hours, at --recent-interval")
    parser.add_argument("--recent-interval", type=float, default=10, help="seconds between recent rounds")
    parser.add_argument("--loads", type=int, default=3, help="loads of each page; the median is printed")
    parser.add_argument("--dir", type=Path, default=None, help="where to build the store (default: a temp dir)")
    parser.add_argument("--store", type=Path, default=None, help="measure a store this bench built before (kept)")
    parser.add_argument("--keep", action="store_true", help="keep the store built, for --store next time")
    parser.add_argument(
        "--postgresql", action="store_true", help="build the store in a throwaway PostgreSQL server instead of SQLite"
    )
    args = parser.parse_args()
    if args.postgresql and (args.store or args.keep):
        parser.error("--postgresql builds a fresh store in a throwaway server: no --store or --keep with it")
    bindir = pg_bindir() if args.postgresql else None
    if args.postgresql and bindir is None:
        parser.error("--postgresql needs PostgreSQL's server programs (apt install postgresql)")
    root = Path(tempfile.mkdtemp(prefix="gpulens-dash-bench-", dir=args.dir))
    cluster = Cluster(args.nodes, args.gpus)
    try:
        if bindir is not None:
            with postgresql_server(bindir, root) as url:
                make_store(url, cluster, args)
                measure_store(url, cluster, args.loads)
        else:
            store = args.store or root / "dashboard.db"
            if args.store is None:
                make_store(f"sqlite:///{store}", cluster, args)
            measure_store(f"sqlite:///{store}", cluster, args.loads)
    finally:
        if args.keep and args.store is None:
            log(f"store kept: {root / 'dashboard.db'}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


def measure_store(url: str, cluster: Cluster, loads: int) -> None:
    # A fresh handle, as a dashboard process has: the writer's connections are gone (SQLite: the WAL checkpointed).
    db = Database(url, clock=ManualClock(END))
    try:
        measure_pages(db, cluster, loads)
    finally:
        db.close()


def make_store(url: str, cluster: Cluster, args: argparse.Namespace) -> None:
    db = Database(url, clock=ManualClock(END))
    try:
        db.upgrade()
        steps = timeline(args.hours, args.interval, args.recent_hours, args.recent_interval)
        log(f"writing {len(steps)} rounds of {args.nodes * args.gpus} GPUs ({args.hours:g} h)")
        started = time.perf_counter()
        rows = build(db, cluster, steps)
        log(f"written in {time.perf_counter() - started:.0f} s; rolling up")
        started = time.perf_counter()
        Rollups(db, settle_s=0).run(END)
        log(f"rolled up in {time.perf_counter() - started:.0f} s")
        emit("dashboard_store_rows", rows, "rows")
    finally:
        db.close()


def measure_pages(db: Database, cluster: Cluster, loads: int) -> None:
    app = create_app(db, alerts=stall_alert(cluster))
    tune_garbage_collector()  # as `gpulens dashboard` does once its app is built
    seen, raw = Callbacks(), Callbacks()  # on the wire (gzip, time included), and before gzip
    node, _index, uuid = cluster.identity[1][3]
    pages = {
        "overview": "/",
        "jobs": "/jobs",
        "job_1h": "/jobs/job-0",
        "job_24h": "/jobs/job-0?range=24h",
        "node_1h": f"/nodes/{node}",
        "node_24h": f"/nodes/{node}?range=24h",
        "gpu_24h": f"/gpus/{uuid}?range=24h",
        "interconnect": "/interconnect",
        "alerts": "/alerts",
    }
    with serving(timed(CompressAndCache(timed(app.server.wsgi_app, raw)), seen)) as base:  # as the dashboard serves
        log(f"loading {len(pages)} pages in headless Chromium")
        results = measure(base, pages, loads, seen)
    for name, ms in results.items():
        emit(f"dashboard_{name}_render", ms, "ms")
    # the loads timed (each page's first load warms the browser's cache and the server's: its callbacks apart)
    calls = list(zip(seen.times_ms, seen.outputs, seen.first, strict=True))
    timed_ms = [(ms, out) for ms, out, first in calls if not first]
    emit("dashboard_slowest_callback", max(ms for ms, _ in timed_ms), "ms")
    emit("dashboard_slowest_callback_first_loads", max(ms for ms, _, first in calls if first), "ms")
    for ms, output in sorted(timed_ms, reverse=True)[:3]:
        log(f"  a slow callback: {ms:.0f} ms, {output}")
    emit("dashboard_largest_payload", max(seen.payloads) / 1000, "kB")
    emit("dashboard_largest_payload_uncompressed", max(raw.payloads) / 1000, "kB")


if __name__ == "__main__":
    sys.exit(main())
