"""The Prometheus read backend over a real VictoriaMetrics (Debian's ``victoria-metrics``) that scrapes the simulated
exporters itself (``-promscrape.config``; the stack of tests/storage/promstack.py): ``gpulens query`` agrees with
the SQL path, every dashboard page reads its data and renders in Chromium, ``gpulens alerts run`` fires
CommunicationStall on the stalled job over either data source, and the reads where MetricsQL answers otherwise
than PromQL (docs/victoriametrics.md) give what they give over Prometheus.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulens.settings import StoreAuth
from gpulens.storage.connect import open_existing_database
from gpulens.storage.prometheus import PromReader
from gpulens.storage.prometheus import recording as rec
from gpulens.storage.prometheus.client import PromQueryError
from gpulens.storage.reading import NotAvailableOnBackend, TooManySeriesError
from gpulens.storage.sqlreader import SqlReader
from tests.prom import query, running_victoriametrics, running_vmalert, wait_for
from tests.storage.promstack import (
    FROZEN_NODES,
    NODES,
    Hook,
    Stack,
    fired,
    run_gpulens,
    running_stack,
    wait_for_scrapes,
)
from tests.storage.test_prometheus import _close, reader, sql_readings, vars_of, wait_until


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, victoriametrics_bin: str) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("vmstack")
    with running_stack(root, victoriametrics_bin, running_victoriametrics) as running:
        wait_for(running.prom_gl, "count(gpulens_gpu_up)", lambda r: bool(r) and r[0]["value"][1] == "16")
        wait_for(running.prom_dcgm, "count(DCGM_FI_DEV_GPU_UTIL)", lambda r: bool(r) and r[0]["value"][1] == "8")
        wait_until(lambda: len(sql_readings(running.sql_url)) == 8, 60, "the collector's first rounds")
        wait_for_scrapes(running)
        yield running


def test_query_latest_gives_every_gpu_with_the_values_of_the_sql_path(stack: Stack) -> None:
    frozen = sql_readings(stack.sql_url)
    assert len(frozen) == 8
    out = run_gpulens("query", "latest", "--json", "--db", "prometheus+" + stack.prom_gl)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert {(r["node"], r["gpu"]) for r in rows} == {(n, i) for n in (*NODES, *FROZEN_NODES) for i in range(4)}
    by_uuid = {r["uuid"]: r for r in rows}
    compared = 0
    for reading in frozen:
        row = by_uuid[reading.uuid]
        for name, value in vars_of(reading).items():
            if name in ("timestamp", "xid_errors", "mig_enabled"):
                continue
            assert _close(row[name], value), (reading.node, reading.gpu, name, row[name], value)
            compared += value is not None
        assert (row["job_id"], row["user"]) == ("frozen-train", "alice")
    assert compared > 8 * 30


class Ahead:
    """A clock a minute ahead: a reading stamped "now" instead of with its sample's time shows."""

    def now(self) -> float:
        return time.time() + 60

    def monotonic(self) -> float:
        return time.monotonic()


def test_sample_times_are_the_scrapes_over_both_sources(stack: Stack) -> None:
    """A reading's time is its newest sample's (``timestamp()``), over dcgm-exporter families too: of a selector
    of several names, where MetricsQL answers ``timestamp()`` of an expression that is not a selector with nothing."""
    for base in (stack.prom_gl, stack.prom_dcgm):
        began = time.time()
        readings = PromReader("prometheus+" + base, StoreAuth(min_step_s=1.0), clock=Ahead()).latest_readings()
        assert len(readings) >= 8
        for r in readings:
            assert began - 10 < r.timestamp <= time.time(), (base, r.uuid)


def test_dcgm_families_read_through_the_same_field_table(stack: Stack) -> None:
    gl, dcgm = reader(stack.prom_gl), reader(stack.prom_dcgm)
    ours = {r.uuid: r for r in gl.latest_readings() if r.node in NODES}
    theirs = dcgm.latest_readings()
    assert {(r.node, r.gpu, r.uuid, r.model) for r in theirs} == {
        (r.node, r.gpu, r.uuid, r.model) for r in ours.values()
    }
    one = dcgm.latest_readings(node="node-01")
    assert [(r.node, r.gpu) for r in one] == [("node-01", i) for i in range(4)]
    assert {(j.uuid, j.job_id) for j in dcgm.current_jobs()} == {(uuid, "llm-pretrain") for uuid in ours}
    with pytest.raises(NotAvailableOnBackend, match=r"^GPU processes: not available on Prometheus \(it holds"):
        dcgm.current_processes()
    assert len(gl.current_processes()) > 0


def test_one_query_per_field_and_the_series_limit(stack: Stack) -> None:
    gl = reader(stack.prom_gl)
    readings = gl.latest_readings()
    live = {r.uuid for r in readings if r.node in NODES}
    gl.present_names()  # its list of metric names read now, not inside the count
    before = gl.client.stats.queries
    now = time.time()
    data = gl.series(None, ["utilization_ratio", "power_watts", "energy_joules_total"], now - 30, now, 10)
    assert gl.client.stats.queries - before == 3
    assert set(data) == {r.uuid for r in readings}
    for uuid, series in data.items():
        assert series.step_seconds == 4.0
        rates = [v for v in series.values["energy_joules_total"] if v is not None]
        assert rates
        assert all(10 < v < 10_000 if uuid in live else v == 0 for v in rates)
        assert any(v is not None for v in series.values["power_watts"])
    with pytest.raises(TooManySeriesError, match=r"over the limit of 5 \(\[database\] max_series\)"):
        reader(stack.prom_gl, max_series=5).latest_readings()


def test_a_query_over_the_length_limit_says_why_in_a_few_lines(stack: Stack) -> None:
    """VictoriaMetrics refuses a query longer than ``-search.maxQueryLen`` (16 KB by default: 600 GPUs listed by
    UUID); the error names the flag without quoting the whole query."""
    uuids = [f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(600)]
    now = time.time()
    with pytest.raises(PromQueryError, match=r"maxQueryLen=16384") as refused:
        reader(stack.prom_gl).series(uuids, ["power_watts"], now - 60, now, 10)
    assert len(str(refused.value)) < 1000


def test_job_summaries_agree_with_the_sql_path_on_the_same_scrape(stack: Stack) -> None:
    def frozen_job_read() -> bool:
        end = time.time()
        return any(j.job_id == "frozen-train" for j in reader(stack.prom_gl).jobs(end - 300, end))

    # A store a few seconds old can answer a range query without the newest steps (its latency offset and step
    # alignment): wait until its range reads hold the job, then read both paths at one time.
    wait_until(frozen_job_read, 60, "the frozen job in VictoriaMetrics's range reads")
    now = time.time()
    sql = SqlReader(open_existing_database(stack.sql_url))
    try:
        stored = {j.job_id: j for j in sql.jobs(now - 300, now)}["frozen-train"]
    finally:
        sql.close()
    read = {j.job_id: j for j in reader(stack.prom_gl).jobs(now - 300, now)}["frozen-train"]
    assert (read.gpus, read.nodes, read.user) == (stored.gpus, stored.nodes, stored.user)
    assert len(read.gpus) == 8
    assert stored.utilization_ratio_mean is not None
    assert stored.memory_used_bytes_mean is not None
    assert read.utilization_ratio_mean == pytest.approx(stored.utilization_ratio_mean, abs=0.01)
    assert read.memory_used_bytes_mean == pytest.approx(stored.memory_used_bytes_mean, rel=0.01)
    assert read.memory_used_bytes_max == pytest.approx(stored.memory_used_bytes_max, rel=0.01)
    assert read.gpu_hours > 0


def page_renders(store: PromReader) -> dict[str, Callable[[], Any]]:
    """Each page's render function over ``store``, as the dashboard calls it (the last 15 minutes)."""
    from gpulens.dashboard.components import ViewState
    from gpulens.dashboard.context import Context
    from gpulens.dashboard.grid import DEFAULT_SORT
    from gpulens.dashboard.heatmaps import DEFAULT_METRIC
    from gpulens.dashboard.pages import gpu, interconnect, job, jobs, node, overview

    context = Context(db=store, clock=store.clock)
    state = ViewState(range="15m")
    uuid = store.latest_readings(node="node-00")[0].uuid
    return {
        "overview": lambda: overview.render(context, state, DEFAULT_METRIC, DEFAULT_SORT, "", 1),
        "jobs": lambda: jobs.render(context, state, "all", "", 1),
        "job": lambda: job.render(context, state, "llm-pretrain"),
        "node": lambda: node.render(context, state, "node-00"),
        "gpu": lambda: gpu.render(context, state, uuid),
        "interconnect": lambda: interconnect.render(context, state, "node-00"),
    }


def test_every_page_reads_its_data(stack: Stack) -> None:
    """Over either source no page says it could not read its data, each reads series and shows the stack's GPUs or
    job."""
    for base in (stack.prom_gl, stack.prom_dcgm):
        store = reader(base)
        for name, render in page_renders(store).items():
            before = store.client.stats.series
            shown = repr(render())
            assert "Could not read the data" not in shown, (base, name)
            assert store.client.stats.series > before, (base, name)
            assert "node-0" in shown or "llm-pretrain" in shown, (base, name)


def test_dashboard_pages_render_with_data_in_chromium(stack: Stack) -> None:
    from gpulens.dashboard.app import create_app
    from tests.dashboard.browser import chromium, serving, wait_rendered

    gl = reader(stack.prom_gl)
    uuid = next(r.uuid for r in gl.latest_readings() if r.node == "node-00")
    # VictoriaMetrics leaves a range query's last 30 s out (-search.latencyOffset), and the job page reads the job
    # over its range: a stack started moments before (a fresh pytest-xdist worker's) holds nothing there yet
    wait_until(
        lambda: gl.jobs(time.time() - 3600, time.time(), job_id="llm-pretrain"), 90, "llm-pretrain's samples in a range"
    )
    pages = {
        "/": "node-00",
        "/jobs": "llm-pretrain",
        "/jobs/llm-pretrain": "node-01",
        "/nodes/node-00": "python",
        f"/gpus/{uuid}": "node-00",
        "/interconnect": "eq-00:0",
    }
    with serving(create_app(gl)) as base, chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        for path, text in pages.items():
            page.goto(base + path)
            wait_rendered(page)
            body = page.inner_text("body")
            assert text in body, path
            assert "Could not read the data" not in body, path
            assert "No data yet" not in body, path
            assert page.locator(".main-svg").count() > 0, path
        assert errors == []


def test_query_series_jobs_and_targets(stack: Stack) -> None:
    db = ["--db", "prometheus+" + stack.prom_gl, "--config", str(stack.config_gl)]
    uuid = reader(stack.prom_gl).latest_readings(node="node-00")[0].uuid
    series = run_gpulens("query", "series", *db, "--gpu", uuid, "--field", "power_watts", "--since", "1m", "--json")
    assert series.returncode == 0, series.stderr
    rows = json.loads(series.stdout)
    assert rows
    assert all(r["uuid"] == uuid and r["power_watts"] > 0 for r in rows)
    jobs = run_gpulens("query", "jobs", *db, "--since", "5m", "--json")
    assert jobs.returncode == 0, jobs.stderr
    by_id = {j["job_id"]: j for j in json.loads(jobs.stdout)}
    assert set(by_id) == {"llm-pretrain", "frozen-train"}
    assert (by_id["llm-pretrain"]["gpus"], by_id["llm-pretrain"]["nodes"]) == (8, 2)
    targets = run_gpulens("query", "targets", *db, "--json")
    assert targets.returncode == 0, targets.stderr
    health = json.loads(targets.stdout)
    assert {t["target"].split("/")[0] for t in health} == {*NODES, *FROZEN_NODES}  # VictoriaMetrics's scrape jobs
    assert all(t["up"] for t in health)


def test_alerts_run_fires_the_stall_over_both_sources_and_delivers_it(stack: Stack) -> None:
    for source in ("gl", "dcgm"):
        try:
            alerts = wait_until(lambda s=source: fired(f"/{s}", "CommunicationStall"), 150, f"the stall ({source})")
        except AssertionError as timed_out:
            raise AssertionError(f"{timed_out}; its engine:\n{stack.engine_report(source)}") from None
        assert {a["labels"]["job_id"] for a in alerts} == {"llm-pretrain"}
        assert len({a["fingerprint"] for a in alerts}) == 1
        delivered = {a["labels"]["alertname"] for p in Hook.payloads[f"/{source}"] for a in p["alerts"]}
        # nothing else goes wrong in this scenario; the Watchdog, always firing, reaches webhooks
        assert delivered == {"CommunicationStall", "Watchdog"}


def test_vmalert_keeps_the_recorded_series_fresh_for_the_doctor(stack: Stack, vmalert_bin: str, tmp_path: Path) -> None:
    """vmalert evaluating the exported rules against the live VictoriaMetrics (as docs/victoriametrics.md runs it,
    every 2 s here), the recorded series written back by remote write: the doctor tells every recorded name present,
    and the recorded GPUs up and held are the stack's. (``test_victoriametrics_recording.py`` checks the pages' data
    from them over a replayed history.)"""
    rules = tmp_path / rec.RULE_FILE
    rules.write_text(rec.rules_yaml(2, 1))

    def doctor() -> subprocess.CompletedProcess[str] | None:
        done = run_gpulens("rules", "doctor", "--db", "prometheus+" + stack.prom_gl)
        return done if done.returncode == 0 else None

    with running_vmalert(vmalert_bin, tmp_path, stack.prom_gl, rules):
        done = wait_until(doctor, 90, "every recorded series present")
        up = wait_for(stack.prom_gl, f"sum({rec.NODE_UP})", lambda r: bool(r) and r[0]["value"][1] == "16")
        held = {r["metric"]["job_id"]: r["value"][1] for r in query(stack.prom_gl, rec.JOB_GPUS)}
    assert up
    assert "evaluated every 2s" in done.stdout
    assert all(f"present  {name}  (newest " in done.stdout for name in rec.names())
    assert f"{len(rec.names())} present, 0 stale, 0 missing" in done.stdout
    assert "pages reading raw series" not in done.stdout
    assert held == {"llm-pretrain": "8", "frozen-train": "8"}
