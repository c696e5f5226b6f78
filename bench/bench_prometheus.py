"""The dashboard over Prometheus: time, queries and series per page for a simulated cluster of ``NODES`` x 8 GPUs.

A real Prometheus (Debian's package) serves ``HOURS`` hours of history, one sample every ``STEP_S`` seconds, of
every series ``NODES`` gpulens exporter nodes export (about 550 per node, jobs and their turnover included; written
as TSDB blocks with ``promtool``: ``tests.storage.promblocks``). Then each page's data loading runs as the dashboard
runs it (the page's render function with a ``PromReader``, server-side) over the dashboard's default range (the
last hour), and, unless ``--no-browser``, each page loads whole in headless Chromium (the dashboard app over the same
reader: request, callbacks, charts drawn). Over Prometheus each page is timed twice: reading raw series only
(``raw``), then with the recording rules (``gpulens rules export --format prometheus-recording``, evaluated at their
interval over the whole history by ``promtool tsdb create-blocks-from rules``, as a Prometheus evaluating them since
before the range would have; ``recorded``). The rules' cost is measured as Prometheus evaluates them: each rule's
expression as an instant query at the history's end, Prometheus's own ``process_cpu_seconds_total`` read before and
after. With ``--engines=prometheus,victoriametrics`` the same pages are timed (raw) over a real VictoriaMetrics
(Debian's ``victoria-metrics``) holding the same samples, imported through its Prometheus text import API
(``tests.storage.promblocks.import_history``), its result cache off (each load evaluated, as in Prometheus): raw,
then with the same rules replayed over the history by ``vmalert -replay.timeFrom -replay.timeTo`` (their series
written back by remote write; ``recorded``), the rules' cost measured the same way (VictoriaMetrics's own
``process_cpu_seconds_total``). With ``--rules-minutes M`` the rules are backfilled over the history's last ``M``
minutes only (``youngMmin`` instead of ``recorded``): a Prometheus whose rules were loaded ``M`` minutes before the
end, whose pages read the recorded series for the span they cover and the raw series for the rest.
Printed per page: milliseconds (the median of ``REPEAT`` loads), the CPU seconds of the store and of gpulens per
load, PromQL queries and series returned. Usage: ``python -m bench.bench_prometheus [NODES] [--no-browser]
[--dir=DIR] [--pages=NAME,...] [--engines=NAME,...]``: ``--dir`` keeps the built TSDB (with the backfilled rules, and
VictoriaMetrics's data) in ``DIR`` and reuses it when run again with the same ``NODES`` (building takes minutes);
``--pages`` times only the named pages.
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import options

NODES = 1000
HOURS = 1
STEP_S = 60
REPEAT = 3
PAGES = ("overview", "jobs", "job", "node", "gpu", "interconnect")
ENGINES = ("prometheus", "victoriametrics")
BLOCK_FLAGS = ("--storage.tsdb.min-block-duration=2h", "--storage.tsdb.max-block-duration=2h")
# no result cache (a repeated load is evaluated again, as Prometheus does), queries that list thousands of GPUs
# (docs/victoriametrics.md), the client's deadline for a query
VM_FLAGS = ("-search.disableCache", "-search.maxQueryLen=1MB", "-search.maxQueryDuration=120s")


class FixedClock:
    """The end of the written history is "now" for every page."""

    def __init__(self, at: float) -> None:
        self.at = at

    def now(self) -> float:
        return self.at

    def monotonic(self) -> float:
        return time.monotonic()


def page_loads(store: Any, names: list[str]) -> dict[str, Callable[[], Any]]:
    from gpulens.dashboard.components import ViewState
    from gpulens.dashboard.context import Context
    from gpulens.dashboard.grid import DEFAULT_SORT
    from gpulens.dashboard.heatmaps import DEFAULT_METRIC
    from gpulens.dashboard.pages import gpu, interconnect, job, jobs, node, overview
    from gpulens.dashboard.timerange import DEFAULT_RANGE

    context = Context(db=store, clock=store.clock)
    state = ViewState(range=DEFAULT_RANGE)
    some = store.latest_readings(node=names[1])[0].uuid
    return {
        "overview": lambda: overview.render(context, state, DEFAULT_METRIC, DEFAULT_SORT, "", 1),
        "jobs": lambda: jobs.render(context, state, "all", "", 1),
        "job": lambda: job.render(context, state, "job-1"),  # two nodes, 16 GPUs
        "node": lambda: node.render(context, state, names[1]),
        "gpu": lambda: gpu.render(context, state, some),
        "interconnect": lambda: interconnect.render(context, state, names[1]),
    }


def browser_loads(store: Any, names: list[str]) -> dict[str, float]:
    """Milliseconds to load each page whole in headless Chromium (the median of ``REPEAT``)."""
    from gpulens.dashboard.app import create_app
    from tests.dashboard.browser import chromium, serving, wait_rendered

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no request log between the figures
    uuid = store.latest_readings(node=names[1])[0].uuid
    paths = {
        "overview": "/",
        "jobs": "/jobs",
        "job": "/jobs/job-1",
        "node": f"/nodes/{names[1]}",
        "gpu": f"/gpus/{uuid}",
        "interconnect": "/interconnect",
    }
    out = {}
    with serving(create_app(store, clock=store.clock)) as base, chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        for name, path in paths.items():
            times = []
            for _ in range(REPEAT):
                began = time.perf_counter()
                page.goto(base + path)
                wait_rendered(page, timeout_ms=120_000)
                times.append(time.perf_counter() - began)
                if "Could not read the data" in page.inner_text("body"):
                    raise RuntimeError(f"{path} failed to load its data")
            out[name] = statistics.median(times) * 1000
    return out


def main() -> int:
    parser = options.parser(
        "bench.bench_prometheus",
        __doc__,
        "",
        "100 --no-browser",
        "--no-browser --dir=/tmp/prom-tsdb --pages=jobs,node",
        "--no-browser --engines=prometheus,victoriametrics",
        "--dir=/tmp/prom-young --rules-minutes 5",
    )
    parser.add_argument("nodes", nargs="?", type=int, default=NODES, help=f"simulated nodes (default {NODES})")
    parser.add_argument("--no-browser", action="store_true", help="time the pages' data only, not Chromium")
    parser.add_argument("--dir", type=Path, help="keep the built TSDB here, and reuse it when built for as many nodes")
    parser.add_argument("--pages", help="time only these pages (comma-separated: " + ", ".join(PAGES) + ")")
    parser.add_argument(
        "--rules-minutes",
        type=int,
        default=None,
        help="backfill the recording rules over the history's last MINUTES only: a Prometheus whose rules were loaded "
        "that long ago (give it a --dir of its own; default: the whole history)",
    )
    parser.add_argument(
        "--engines",
        default="prometheus",
        help="the stores timed, in turn (comma-separated: prometheus, victoriametrics)",
    )
    args = parser.parse_args()
    pages = args.pages.split(",") if args.pages else None
    if pages is not None and not set(pages) <= set(PAGES):
        parser.error(
            f"--pages: unknown page {sorted(set(pages) - set(PAGES))[0]!r}; expected some of {', '.join(PAGES)}"
        )
    engines = args.engines.split(",")
    if not engines or not set(engines) <= set(ENGINES):
        parser.error(f"--engines: expected some of {', '.join(ENGINES)}, got {args.engines!r}")
    if args.rules_minutes is not None and not 0 < args.rules_minutes * 60 <= HOURS * 3600:
        parser.error(f"--rules-minutes: between 1 and {HOURS * 60} (the history's length)")
    if args.rules_minutes is not None and engines != ["prometheus"]:
        parser.error("--rules-minutes: Prometheus only (--engines=prometheus)")
    if args.dir is not None:
        return measure(
            args.dir, args.nodes, pages, browser=not args.no_browser, engines=engines, young=args.rules_minutes
        )
    with tempfile.TemporaryDirectory(prefix="gpulens-bench-prom-") as temporary:
        return measure(
            Path(temporary), args.nodes, pages, browser=not args.no_browser, engines=engines, young=args.rules_minutes
        )


def history_end(work: Path, nodes: int) -> float:
    """The end of the history built under ``work`` for ``nodes`` nodes (by either engine), else of a new one: a step
    before a 2-hour boundary (one TSDB block, one pass of promtool over the input)."""
    for marker in ("built.txt", "built-vm.txt"):
        built = work / marker
        if built.exists() and built.read_text().split()[0] == str(nodes):
            return float(built.read_text().split()[1])
    return float(int(time.time()) // 7200 * 7200 - STEP_S)


def build(work: Path, nodes: int, end: float) -> None:
    """The history of ``nodes`` nodes ending at ``end`` under ``work / "prom"`` (kept there: reused when built
    before for as many nodes)."""
    from tests.storage.promblocks import GPUS, create_blocks

    gpus = nodes * GPUS
    built = work / "built.txt"
    if built.exists() and built.read_text().split()[0] == str(nodes):
        print(f"prometheus_history_reused_{gpus}_gpus: {work}")
        return
    (work / "prom").mkdir(parents=True, exist_ok=True)
    samples = HOURS * 3600 // STEP_S + 1
    began = time.perf_counter()
    series = create_blocks("promtool", work / "prom", nodes, round(end) - (samples - 1) * STEP_S, STEP_S, samples)
    print(f"prometheus_history_series_{gpus}_gpus: {series} series")
    print(f"prometheus_history_samples_{gpus}_gpus: {series * samples} samples")
    print(f"prometheus_history_backfill_{gpus}_gpus: {time.perf_counter() - began:.0f} s")
    built.write_text(f"{nodes} {end:.0f}\n")


def import_vm(work: Path, base: str, nodes: int, end: float) -> None:
    """The same history imported into the VictoriaMetrics at ``base`` (its data under ``work / "vm"``: reused when
    imported before for as many nodes)."""
    from tests.storage.promblocks import GPUS, import_history

    gpus = nodes * GPUS
    built = work / "built-vm.txt"
    if built.exists() and built.read_text().split()[0] == str(nodes):
        print(f"victoriametrics_history_reused_{gpus}_gpus: {work}")
        return
    samples = HOURS * 3600 // STEP_S + 1
    began = time.perf_counter()
    series = import_history(base, nodes, round(end) - (samples - 1) * STEP_S, STEP_S, samples)
    print(f"victoriametrics_history_series_{gpus}_gpus: {series} series")
    print(f"victoriametrics_history_import_{gpus}_gpus: {time.perf_counter() - began:.0f} s")
    built.write_text(f"{nodes} {end:.0f}\n")


def server_cpu(marker: str) -> float:
    """CPU seconds the processes whose command line holds ``marker`` (the store's data path) have used."""
    total = 0.0
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "cmdline").read_bytes().decode(errors="replace"):
                fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            continue
    return total


def time_pages(key: str, store: Any, nodes: int, pages: list[str] | None, *, browser: bool, marker: str = "") -> None:
    """Print each page's data time (the median of ``REPEAT``), queries and series, and the CPU seconds per load of
    the store (the processes whose command line holds ``marker``) and of gpulens (this process, the decoding and
    the page's records: load-independent, where the time is not on a shared machine); then its time in Chromium."""
    from tests.storage.promblocks import GPUS

    gpus = nodes * GPUS
    names = [f"node-{n:04d}" for n in range(nodes)]
    for name, load in page_loads(store, names).items():
        if pages is not None and name not in pages:
            continue
        times = []
        cpu = (server_cpu(marker), time.process_time())
        for _ in range(REPEAT):
            before = (store.client.stats.queries, store.client.stats.series)
            began = time.perf_counter()
            load()
            times.append(time.perf_counter() - began)
        queries = store.client.stats.queries - before[0]
        returned = store.client.stats.series - before[1]
        spent = ((server_cpu(marker) - cpu[0]) / REPEAT, (time.process_time() - cpu[1]) / REPEAT)
        print(f"{key}_{name}_page_data_{gpus}_gpus: {statistics.median(times) * 1000:.0f} ms")
        print(f"{key}_{name}_page_cpu_{gpus}_gpus: store {spent[0]:.2f} s + gpulens {spent[1]:.2f} s")
        print(f"{key}_{name}_page_queries_{gpus}_gpus: {queries} queries")
        print(f"{key}_{name}_page_series_{gpus}_gpus: {returned} series")
        sys.stdout.flush()
    if browser:
        for name, ms in browser_loads(store, names).items():
            if pages is None or name in pages:
                print(f"{key}_{name}_page_browser_{gpus}_gpus: {ms:.0f} ms")


def record(work: Path, nodes: int, end: float, minutes: int | None = None) -> None:
    """Backfill the recording rules over the history under ``work / "prom"`` (once per rules file), or over its last
    ``minutes`` only."""
    from gpulens.storage.prometheus.recording import INTERVAL_S, rules_yaml
    from tests.prom import running_prometheus
    from tests.storage.promblocks import backfill_rules, move_blocks

    rules = rules_yaml(INTERVAL_S, STEP_S)
    marked = rules if minutes is None else f"# over the last {minutes} minutes\n{rules}"
    path = work / "recording.yml"
    if path.exists() and path.read_text() == marked:
        return
    if path.exists():  # series of other rules would add up with these: build the history again
        raise SystemExit(f"{work} holds the series of other recording rules (or spans): remove it and run again")
    path.write_text(marked)
    began = time.perf_counter()
    start = int(end) - ((HOURS * 3600 if minutes is None else minutes * 60) // STEP_S) * STEP_S
    with running_prometheus("prometheus", work / "prom", {}, interval_s=STEP_S, flags=BLOCK_FLAGS) as base:
        backfill_rules("promtool", base, path, start, int(end) + STEP_S, work / "recorded")
    move_blocks(work / "recorded", work / "prom" / "tsdb")
    print(f"prometheus_recording_backfill_{nodes * 8}_gpus: {time.perf_counter() - began:.0f} s")


def record_vm(work: Path, base: str, nodes: int, end: float) -> None:
    """Replay the recording rules over the history in the VictoriaMetrics at ``base`` (``vmalert -replay.timeFrom
    -replay.timeTo``: each rule evaluated at the rules' interval, the series written back by remote write; once per
    rules file), and print what VictoriaMetrics spent on it (range queries: less than as many live evaluations)."""
    from gpulens.storage.prometheus.recording import INTERVAL_S, rules_yaml
    from tests.prom import replay_rules

    rules = rules_yaml(INTERVAL_S, STEP_S)
    path = work / "recording-vm.yml"
    if path.exists() and path.read_text() == rules:
        return
    if path.exists():
        raise SystemExit(f"{work / 'vm'} holds the series of other recording rules: remove it and run again")
    start = int(end) - (HOURS * 3600 // STEP_S) * STEP_S
    pending = work / "recording-vm.yml.replaying"  # the marker once the replay is through
    pending.write_text(rules)
    began, cpu = time.perf_counter(), server_cpu(str(work / "vm"))
    replay_rules("vmalert", base, pending, start, int(end) + STEP_S)
    pending.rename(path)
    spent = server_cpu(str(work / "vm")) - cpu
    print(f"victoriametrics_recording_replay_{nodes * 8}_gpus: {time.perf_counter() - began:.0f} s, {spent:.0f} CPU-s")


def rule_cost(base: str, at: float, gpus: int, engine: str = "prometheus") -> None:
    """The CPU the store (``engine``) spends on one evaluation of the recording rules (each expression as an instant
    query at ``at``, one at a time, as Prometheus or vmalert evaluates them), and that as a share of one core over the
    rules' interval."""
    from gpulens.settings import StoreAuth
    from gpulens.storage.prometheus.client import PromClient
    from gpulens.storage.prometheus.recording import INTERVAL_S, rules
    from tests.conftest import http_get

    def cpu() -> float:
        text = http_get(base + "/metrics")[2].decode()
        return float(next(ln.split()[1] for ln in text.splitlines() if ln.startswith("process_cpu_seconds_total")))

    client = PromClient("prometheus+" + base, StoreAuth(), timeout_s=120, environ=None)
    costs = []
    for _ in range(REPEAT):
        before, series = cpu(), 0
        for rule in rules(INTERVAL_S, STEP_S):
            series += len(client.query(rule.expr, at, max_series=10**7))
        costs.append(cpu() - before)
    spent = statistics.median(costs)
    print(f"{engine}_recording_rules_cpu_{gpus}_gpus: {spent:.2f} CPU-s per evaluation ({series} series)")
    print(f"{engine}_recording_rules_core_share_{gpus}_gpus: {spent / INTERVAL_S:.1%} of a core at {INTERVAL_S} s")


def measure(
    work: Path,
    nodes: int,
    pages: list[str] | None = None,
    *,
    browser: bool = True,
    engines: Sequence[str] = ("prometheus",),
    young: int | None = None,
) -> int:
    from gpulens.settings import StoreAuth
    from gpulens.storage.prometheus import PromReader
    from tests.prom import running_prometheus, running_victoriametrics

    end = history_end(work, nodes)
    if "prometheus" in engines:
        build(work, nodes, end)
        record(work, nodes, end, young)
    recorded = "recorded" if young is None else f"young{young}min"  # rules loaded that long before the end
    for engine in engines:
        print(f"{engine}_load_average_before: {os.getloadavg()[0]:.1f} runnable", flush=True)
        if engine == "prometheus":
            server = running_prometheus("prometheus", work / "prom", {}, interval_s=STEP_S, flags=BLOCK_FLAGS)
        else:
            (work / "vm").mkdir(parents=True, exist_ok=True)
            server = running_victoriametrics(
                "victoria-metrics", work / "vm", {}, interval_s=STEP_S, flags=VM_FLAGS, memory=None
            )
        with server as base:
            if engine == "victoriametrics":
                import_vm(work, base, nodes, end)
                record_vm(work, base, nodes, end)
            rule_cost(base, end, nodes * 8, engine)
            data = str(work / ("prom" if engine == "prometheus" else "vm"))
            for mode in ("raw", recorded):
                store = PromReader(
                    "prometheus+" + base,
                    StoreAuth(min_step_s=STEP_S),
                    clock=FixedClock(end + STEP_S / 2),
                    timeout_s=120,
                    use_recorded=mode != "raw",
                )
                time_pages(f"{engine}_{mode}", store, nodes, pages, browser=browser, marker=data)
                if mode != "raw" and store.recording.missing:
                    print(f"{engine}_recorded_not_used: {store.recording.missing}")
        print(f"{engine}_load_average_after: {os.getloadavg()[0]:.1f} runnable", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
