"""The recording rules (``storage.prometheus.recording``) in a real Prometheus: the exported file passes
``promtool check rules`` and equals the shipped one; backfilled over a simulated cluster's history (``promtool tsdb
create-blocks-from rules``, the rules evaluated at their interval as Prometheus evaluates them), the reader gives the
jobs and interconnect pages the data the raw series give, in fewer queries; without them it reads raw and says once
which file would help; ``gpulens rules doctor`` tells present, stale and missing series.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulens.clock import ManualClock  # now() and monotonic() both stand still
from gpulens.model import GpuReading
from gpulens.settings import StoreAuth
from gpulens.storage.prometheus import PromReader
from gpulens.storage.prometheus import recording as rec
from gpulens.storage.prometheus.recorded import status
from gpulens.storage.records import JOB_POINTS, LINK_ERROR_FIELDS
from tests.prom import running_prometheus
from tests.storage.promblocks import backfill_rules, create_blocks, move_blocks

STEP_S = 60
SAMPLES = 31  # half an hour
NODES = 8
FLAGS = ("--storage.tsdb.min-block-duration=2h", "--storage.tsdb.max-block-duration=2h")
ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def end() -> int:
    return int(time.time()) // 7200 * 7200 - STEP_S


@pytest.fixture(scope="module")
def servers(
    tmp_path_factory: pytest.TempPathFactory, prometheus_bin: str, promtool: str, end: int
) -> Iterator[dict[str, str]]:
    """Two Prometheus servers over the same half hour of ``NODES`` nodes: "raw", and "recorded" with the recording
    rules' series backfilled beside it."""
    raw, recorded = tmp_path_factory.mktemp("raw"), tmp_path_factory.mktemp("recorded")
    start = end - (SAMPLES - 1) * STEP_S
    create_blocks(promtool, raw, NODES, start, STEP_S, SAMPLES)
    shutil.copytree(raw / "tsdb", recorded / "tsdb")
    rules = recorded / "rules.yml"
    rules.write_text(rec.rules_yaml(STEP_S, STEP_S))
    with running_prometheus(prometheus_bin, raw, {}, interval_s=STEP_S, flags=FLAGS) as base:
        backfill_rules(promtool, base, rules, start, end, recorded / "backfilled")
    assert move_blocks(recorded / "backfilled", recorded / "tsdb") >= 1
    with (
        running_prometheus(prometheus_bin, raw, {}, interval_s=STEP_S, flags=FLAGS) as raw_base,
        running_prometheus(prometheus_bin, recorded, {}, interval_s=STEP_S, flags=FLAGS) as recorded_base,
    ):
        yield {"raw": raw_base, "recorded": recorded_base}


def reader(base: str, at: float, *, use_recorded: bool = True) -> PromReader:
    return PromReader(
        "prometheus+" + base, StoreAuth(min_step_s=STEP_S), clock=ManualClock(at), use_recorded=use_recorded
    )


def close(a: float | None, b: float | None, rel: float = 1e-9) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-9)


def test_the_export_passes_promtool_and_is_the_shipped_file(promtool: str, tmp_path: Path) -> None:
    exported = subprocess.run(
        [sys.executable, "-m", "gpulens.cli", "rules", "export", "--format", "prometheus-recording"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    shipped = ROOT / "deploy" / "prometheus" / "rules" / rec.RULE_FILE
    assert exported == shipped.read_text(), "regenerate: gpulens rules export --format prometheus-recording"
    checked = subprocess.run([promtool, "check", "rules", str(shipped)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rec.names())} rules found" in checked.stdout
    for name in rec.names():  # level:metric:operations
        level, metric, operations = name.split(":")
        assert level in ("cluster", "node", "gpu", "job", "port")
        assert metric.startswith("gpulens_")
        assert operations
    other = tmp_path / "other.yml"
    other.write_text(rec.rules_yaml(30, 30))
    assert subprocess.run([promtool, "check", "rules", str(other)], capture_output=True).returncode == 0


def test_job_summaries_from_recorded_series_equal_the_raw_ones(servers: dict[str, str], end: int) -> None:
    at = end + 30
    start = at - 1800
    fast, slow = reader(servers["recorded"], at), reader(servers["recorded"], at, use_recorded=False)
    before = fast.client.stats.queries
    got = {j.job_id: j for j in fast.jobs(start, at)}
    queries = fast.client.stats.queries - before
    assert fast.recording.missing == {}
    want = {j.job_id: j for j in slow.jobs(start, at)}
    assert got.keys() == want.keys()
    assert len(got) >= 4
    turned = {j for j in got if j.endswith(("a", "b")) or "a-" in j or "b-" in j}
    for job, mine in got.items():
        theirs = want[job]
        assert (mine.gpus, mine.nodes, mine.user) == (theirs.gpus, theirs.nodes, theirs.user), job
        # a job is held as of the rules' evaluations, up to an interval after its scrapes: a step more at most
        step = 1800 / JOB_POINTS + 3
        assert abs(mine.gpu_hours - theirs.gpu_hours) <= len(mine.gpus) * step / 3600, job
        assert abs(mine.first_seen - theirs.first_seen) <= step
        assert abs(mine.last_seen - theirs.last_seen) <= step
        # the raw path reads a job that came or went in the range per step (the step means: a narrower spread); the
        # recorded sums are every sample's
        rel = 0.02 if job in turned else 1e-9
        assert close(mine.utilization_ratio_mean, theirs.utilization_ratio_mean, rel), job
        spread = 0.25 if job in turned else 1e-6
        assert close(mine.utilization_ratio_stddev, theirs.utilization_ratio_stddev, spread), job
        assert close(mine.memory_used_bytes_mean, theirs.memory_used_bytes_mean, rel), job
        assert mine.memory_used_bytes_max == theirs.memory_used_bytes_max, job
    assert queries <= 10  # the clock, the pairs, the GPUs per step, 6 statistics (the names are cached)


def test_port_problems_from_recorded_flags_equal_the_raw_ones(servers: dict[str, str], end: int) -> None:
    # the flags are as old as the rules' last evaluation (under an interval): read where both saw the same scrape
    at = end - 30
    fast, slow = reader(servers["recorded"], at), reader(servers["recorded"], at, use_recorded=False)
    got = fast.nic_problems(at - 1800, at)
    assert fast.recording.missing == {}
    want = slow.nic_problems(at - 1800, at)
    assert got == want
    assert len(got) >= NODES
    assert any(got.values())


def check_node_totals(base: str, at: float, gpus: int) -> None:
    """The overview's headline from the recorded node totals read at ``at`` is the one summed from the readings and
    jobs of ``gpus`` GPUs read at the rules' last evaluation (the same scrapes)."""
    from gpulens.dashboard.figures.grids import GridCell
    from gpulens.dashboard.grid import grid_cells
    from gpulens.dashboard.summary import headline

    fast = reader(base, at)
    before = fast.client.stats.queries
    totals = fast.node_totals()
    assert fast.client.stats.queries - before == 3  # the names held, the rules' clock, every node's totals
    assert totals is not None
    assert fast.recording.missing == {}
    summed = min(t.timestamp for t in totals)
    assert at - STEP_S <= summed <= at
    # read raw at the evaluation's own time: what it saw (a scrape within a second after it would not have been)
    slow = reader(base, summed, use_recorded=False)
    assert slow.node_totals() is None
    cells: list[GridCell] = grid_cells(slow.latest_readings(), slow.current_jobs(), now=summed, stale_after_s=120)
    assert {t.node for t in totals} == {c.reading.node for c in cells}
    assert len(cells) == gpus
    mine, theirs = headline(cells, totals), headline(cells)
    assert mine.summed_at == summed
    assert (mine.gpus, mine.up, mine.down, mine.stale) == (theirs.gpus, theirs.up, 0, 0)
    assert (mine.busy, mine.idle, mine.allocated_idle) == (theirs.busy, theirs.idle, theirs.allocated_idle)
    assert mine.busy + mine.idle == mine.up  # (idle GPUs: tests below, over dcgm-exporter pages)
    assert close(mine.utilization_ratio_mean, theirs.utilization_ratio_mean)
    assert abs(mine.memory_used_bytes - theirs.memory_used_bytes) <= gpus  # rounding, a byte a GPU
    assert mine.memory_total_bytes == theirs.memory_total_bytes
    assert close(mine.power_watts, theirs.power_watts)
    assert close(mine.power_limit_watts, theirs.power_limit_watts)


def test_node_totals_from_recorded_series_equal_the_readings_sums(servers: dict[str, str], end: int) -> None:
    """The overview reads the nodes' totals, then of every GPU only the fields its heatmap shows."""
    at = end - 30
    check_node_totals(servers["recorded"], at, NODES * 8)
    # the rules stopped (an hour after the history): stale, read raw and said
    late = reader(servers["recorded"], end + 3600)
    assert late.node_totals() is None
    assert "not evaluated" in late.recording.missing["overview"]


def check_link_summary(base: str, at: float) -> None:
    """The interconnect page from the recorded link loads and the GPUs the store names is the page read raw: the
    chart's GPUs and loads, the degraded links, the GPUs with the most link errors; read at the rules' last
    evaluation (the same scrape)."""
    from gpulens.dashboard.components import ViewState
    from gpulens.dashboard.context import Context
    from gpulens.dashboard.pages import interconnect
    from gpulens.ratios import link_loads

    summary = reader(base, at).link_summary(interconnect.TOP)
    assert summary is not None
    assert at - STEP_S <= summary.timestamp <= at
    now = summary.timestamp  # what the evaluation saw: a scrape just after it would not be in its loads
    fast, slow = reader(base, now), reader(base, now, use_recorded=False)
    assert slow.link_summary(interconnect.TOP) is None
    readings = slow.latest_readings(fields=interconnect.LINK_FIELDS)
    want = {load.uuid: load for load in link_loads(readings)}
    got = {load.uuid: load for load in summary.loads}
    assert got.keys() == want.keys()
    assert len(got) == NODES * 8
    for uuid, load in got.items():
        assert (load.node, load.gpu) == (want[uuid].node, want[uuid].gpu)
        assert math.isclose(load.pcie_ratio, want[uuid].pcie_ratio, rel_tol=1e-9), uuid
        assert math.isclose(load.nvlink_ratio, want[uuid].nvlink_ratio, rel_tol=1e-9), uuid
    named = [r for r in readings if r.uuid in set(summary.named)]
    degraded = interconnect.degraded_links(readings)
    assert len(degraded) >= 2  # the history's NVLink outages
    assert interconnect.degraded_links(named, summary.best_links) == degraded

    def top(of: list[GpuReading]) -> list[float]:
        totals = [sum(getattr(r, f) or 0 for f in LINK_ERROR_FIELDS) for r in of]
        return sorted((t for t in totals if t), reverse=True)[: interconnect.TOP]

    assert top(named) == top(readings)
    assert len(top(readings)) == interconnect.TOP
    # the page whole: the same chart, degraded links and error table as the page read raw
    state = ViewState(range="15m")
    before = (fast.client.stats.series, slow.client.stats.series)
    mine = interconnect.render(Context(db=fast, clock=fast.clock), state, None)
    theirs = interconnect.render(Context(db=slow, clock=slow.clock), state, None)
    series = (fast.client.stats.series - before[0], slow.client.stats.series - before[1])
    for i in range(2, 7):  # the nodes, the chosen one, its topology, the degraded links, the errors
        assert str(mine[i]) == str(theirs[i]), (i, str(mine[i])[-1500:], str(theirs[i])[-1500:])
    chart, raw_chart = mine[1].to_plotly_json()["data"], theirs[1].to_plotly_json()["data"]
    assert chart[0]["z"] == raw_chart[0]["z"]
    assert chart[1]["text"] == raw_chart[1]["text"]
    assert "link loads recorded" in mine[-1]
    assert series[0] < series[1]  # (of 64 GPUs 25 are named for their errors; the bench measures 8,000)


def test_link_summary_from_recorded_loads_gives_the_raw_page(servers: dict[str, str], end: int) -> None:
    check_link_summary(servers["recorded"], end - 30)


def test_without_recorded_series_the_reader_reads_raw_and_says_so_once(servers: dict[str, str], end: int) -> None:
    at = end + 30
    plain, raw = reader(servers["raw"], at), reader(servers["raw"], at, use_recorded=False)
    assert plain.jobs(at - 1800, at) == raw.jobs(at - 1800, at)
    assert plain.nic_problems(at - 1800, at) == raw.nic_problems(at - 1800, at)
    assert plain.node_totals() is None
    assert plain.link_summary(25) is None
    assert set(plain.recording.missing) == {"jobs", "interconnect", "interconnect ports", "overview"}
    hint = plain.recording.hint()
    assert hint is not None
    assert rec.RULE_FILE in hint
    assert "\n" not in hint
    assert plain.recording.hint() is None  # once
    # recorded series that began inside the range (rules loaded after its start) serve the span they cover, the raw
    # series the rest (tests/storage/test_prometheus_young_rules.py compares the values)
    late = reader(servers["recorded"], at)
    got = late.jobs(at - 3 * 3600, at)
    assert {j.job_id for j in got} == {j.job_id for j in raw.jobs(at - 3 * 3600, at)}
    assert "jobs" not in late.recording.missing


def test_doctor_tells_present_stale_and_missing(servers: dict[str, str], end: int, tmp_path: Path) -> None:
    from gpulens.storage.prometheus.client import PromClient

    # the backfilled history: present at its end, stale an hour later
    client = PromClient("prometheus+" + servers["recorded"], StoreAuth(), environ={})
    interval, states = status(client, end + 30)
    assert interval == STEP_S
    assert {s for _, s, _ in states} == {"present"}
    _, later = status(client, end + 3600)
    assert {s for _, s, _ in later} == {"stale"}
    _, none = status(PromClient("prometheus+" + servers["raw"], StoreAuth(), environ={}), end + 30)
    assert {s for _, s, _ in none} == {"missing"}
    # the command over a live Prometheus evaluating the rules (every second) with nothing to scrape: the clock
    # present, every other series missing
    (tmp_path / rec.RULE_FILE).write_text(rec.rules_yaml(1, 1))
    with running_prometheus("prometheus", tmp_path, {}, interval_s=1, rules=[tmp_path / rec.RULE_FILE]) as base:
        deadline = time.monotonic() + 90
        while True:
            done = subprocess.run(
                [sys.executable, "-m", "gpulens.cli", "rules", "doctor", "--db", "prometheus+" + base],
                capture_output=True,
                text=True,
            )
            if "present  " + rec.CLOCK in done.stdout or time.monotonic() > deadline:
                break
            time.sleep(2)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "present  " + rec.CLOCK in done.stdout
    assert "missing  " + rec.JOB_GPUS in done.stdout
    assert "pages reading raw series: jobs, interconnect, interconnect ports, overview" in done.stdout


def test_the_dashboard_says_once_which_rule_file_would_help(servers: dict[str, str], end: int) -> None:
    from gpulens.dashboard.components import ViewState
    from gpulens.dashboard.context import Context
    from gpulens.dashboard.pages import interconnect, jobs

    def statuses(base: str) -> list[str]:
        store = reader(base, end + 30)
        context = Context(db=store, clock=store.clock)
        state = ViewState(range="15m")  # within the history (and the recorded series)
        shown = [jobs.render(context, state, "all", "", 1)[0], interconnect.render(context, state, None)[0]]
        shown.append(jobs.render(context, state, "all", "", 1)[0])
        return [str(s) for s in shown]

    first, second, third = statuses(servers["raw"])
    assert rec.RULE_FILE in first
    assert "jobs" in first
    assert rec.RULE_FILE not in second
    assert rec.RULE_FILE not in third
    assert not any(rec.RULE_FILE in s for s in statuses(servers["recorded"]))


@pytest.mark.parametrize("page", ["current.prom", "legacy.prom"])
def test_rules_read_every_dcgm_exporter_generation_in_gpulens_units(
    page: str, prometheus_bin: str, tmp_path: Path
) -> None:
    """Over a dcgm-exporter page (4.6+ base-unit names, or 2.x-4.5 names), evaluated live: the per-node and per-job
    recorded series are the sums and counts of what the reader reads from the raw series."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from typing import Any

    from gpulens.storage.prometheus.client import PromClient

    # GPU 0, which a job holds, made idle: each count of the overview's headline has a GPU
    held = re.compile(
        r'^((?:DCGM_FI_DEV_GPU_UTIL|DCGM_FI_PROF_GR_ENGINE_ACTIVE)\w*\{[^}]*UUID="GPU-1f0c8a52-[^}]*\}) \S+$', re.M
    )
    text, changed = held.subn(r"\1 0.01", (ROOT / "tests" / "fixtures" / "dcgm" / page).read_text())
    assert changed >= 1

    class Page(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    (tmp_path / rec.RULE_FILE).write_text(rec.rules_yaml(1, 1))
    target = f"127.0.0.1:{server.server_address[1]}"
    try:
        with running_prometheus(
            prometheus_bin, tmp_path, {"dcgm": (target, "/metrics")}, rules=[tmp_path / rec.RULE_FILE]
        ) as base:
            client = PromClient("prometheus+" + base, StoreAuth(), environ={})
            deadline = time.monotonic() + 60
            while not client.query(rec.JOB_GPUS, time.time()) and time.monotonic() < deadline:
                time.sleep(0.5)
            at = time.time()
            store = reader(base, at)
            readings, jobs, totals = store.latest_readings(), store.current_jobs(), store.node_totals()
            recorded = {
                name: {s.labels.get("node") or s.labels.get("job_id"): s.value for s in client.query(name, at)}
                for name in (rec.NODE_UP, rec.NODE_MEMORY_USED, rec.NODE_POWER, rec.NODE_MEMORY_TOTAL, rec.JOB_GPUS)
            }
    finally:
        server.shutdown()
        server.server_close()
    nodes = {r.node for r in readings}
    assert readings
    assert recorded[rec.NODE_UP] == {n: sum(1 for r in readings if r.node == n) for n in nodes}
    for name, field in ((rec.NODE_MEMORY_USED, "memory_used_bytes"), (rec.NODE_POWER, "power_watts")):
        want = {n: sum(getattr(r, field) or 0 for r in readings if r.node == n) for n in nodes}
        assert recorded[name].keys() == want.keys()
        for node, value in want.items():
            assert math.isclose(recorded[name][node], value, rel_tol=1e-6), (name, node)
    holding = {j.job_id: sum(1 for k in jobs if k.job_id == j.job_id) for j in jobs}
    assert recorded[rec.JOB_GPUS] == holding
    assert holding
    # the overview's headline from the nodes' recorded totals is the one the readings give
    from gpulens.dashboard.grid import grid_cells
    from gpulens.dashboard.summary import headline

    cells = grid_cells(readings, jobs, now=at, stale_after_s=60)
    mine, theirs = headline(cells, totals), headline(cells)
    assert mine.summed_at is not None, store.recording.missing
    assert (mine.busy, mine.idle, mine.allocated_idle) == (theirs.busy, theirs.idle, theirs.allocated_idle)
    assert mine.allocated_idle >= 1
    assert close(mine.utilization_ratio_mean, theirs.utilization_ratio_mean, 1e-6)
    for name in ("memory_used_bytes", "memory_total_bytes", "power_watts", "power_limit_watts"):
        assert close(getattr(mine, name), getattr(theirs, name), 1e-6), name


def sent_queries(store: PromReader) -> list[str]:
    """The PromQL ``store`` sends from now on, instant and range, in order."""
    sent: list[str] = []
    query, query_range = store.client.query, store.client.query_range

    def instant(promql: str, *args: object, **kwargs: object) -> object:
        sent.append(promql)
        return query(promql, *args, **kwargs)  # type: ignore[arg-type]

    def ranged(promql: str, *args: object, **kwargs: object) -> object:
        sent.append(promql)
        return query_range(promql, *args, **kwargs)  # type: ignore[arg-type]

    store.client.query, store.client.query_range = instant, ranged  # type: ignore[method-assign, assignment]
    return sent


def check_link_outages(base: str, end: int) -> None:
    """The GPUs read link by link are named by the recorded flags over the range and the raw changes since the last
    evaluation only: the same outages as the raw read, which scans every GPU's count over the whole range."""
    start = end - (SAMPLES - 1) * STEP_S
    # after the last evaluation; just before it; a range that begins 10 minutes before the history and the rules
    for at in (end + 30, end - 30, end - 600):
        fast, slow = reader(base, at), reader(base, at, use_recorded=False)
        sent = sent_queries(fast)
        got = fast.link_outages(at - 1800, at)
        assert got == slow.link_outages(at - 1800, at), at
        assert len({(o.uuid, o.link) for o in got}) >= 2  # the history's NVLink outages
        assert sum(rec.GPU_LINKS_UNSTEADY in q for q in sent) == 1
        # read link by link: the GPUs with an outage, not every GPU (the recorded flag does not take a GPU's first
        # samples for a change; before the history, MetricsQL's raw changes() does: a superset, read whole)
        read = [q for q in sent if q.endswith("== 0")]
        assert len(read) == 1
        if at - 1800 >= start - 2 * STEP_S:
            assert read[0].count("GPU-") == len({o.uuid for o in got}), at - end
        raw_windows = [int(q.split("[")[1].split("s]")[0]) for q in sent if q.startswith("changes(")]
        assert raw_windows
        assert min(raw_windows) <= 5 * STEP_S  # raw: the few minutes since the last evaluation
        # and, where the range begins before the rules' first evaluation, the span before it
        assert len(raw_windows) == (2 if at - 1800 < start - 2 * STEP_S else 1)
        assert fast.recording.missing == {}


def test_link_outages_from_recorded_flags_equal_the_raw_ones(servers: dict[str, str], end: int) -> None:
    check_link_outages(servers["recorded"], end)
