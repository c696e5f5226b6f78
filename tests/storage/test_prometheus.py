"""The Prometheus read backend against a real Prometheus scraping simulated exporters (tests/storage/promstack.py):
``gpulens query`` agrees with the SQL path, ``gpulens alerts run`` fires CommunicationStall on the stalled job over
either data source and delivers it to a webhook, the dashboard pages render with data in Chromium, what Prometheus
lacks is said, and the commands that write refuse a Prometheus URL.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulens.config import ConfigError
from gpulens.model import GpuReading
from gpulens.settings import StoreAuth
from gpulens.storage.connect import open_existing_database
from gpulens.storage.db import DatabaseURLError
from gpulens.storage.prometheus import PromReader
from gpulens.storage.reading import NotAvailableOnBackend, TooManySeriesError
from gpulens.storage.records import JOB_POINTS
from gpulens.storage.sqlreader import SqlReader
from tests.prom import wait_for
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


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, prometheus_bin: str) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("promstack"), prometheus_bin) as running:
        # both servers hold every GPU before any test reads them
        wait_for(running.prom_gl, "count(gpulens_gpu_up)", lambda r: bool(r) and r[0]["value"][1] == "16")
        wait_for(running.prom_dcgm, "count(DCGM_FI_DEV_GPU_UTIL)", lambda r: bool(r) and r[0]["value"][1] == "8")
        wait_until(lambda: len(sql_readings(running.sql_url)) == 8, 60, "the collector's first rounds")
        wait_for_scrapes(running)
        yield running


def sql_readings(url: str) -> list[GpuReading]:
    try:
        sql = SqlReader(open_existing_database(url))
    except (ConfigError, DatabaseURLError):
        return []  # the collector has not created it yet
    try:
        return [r for r in sql.latest_readings() if r.node in FROZEN_NODES]
    finally:
        sql.close()


def reader(base: str, **changes: Any) -> PromReader:
    return PromReader("prometheus+" + base, StoreAuth(min_step_s=1.0, **changes))


def wait_until(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _close(a: Any, b: Any) -> bool:
    """Equal up to the SQL store's precision (its compact units: deciwatts, KiB, ...)."""
    if not isinstance(a, int | float) or not isinstance(b, int | float) or isinstance(a, bool) or isinstance(b, bool):
        return bool(a == b)
    return math.isclose(float(a), float(b), rel_tol=2e-3, abs_tol=0.06)


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
            if name in ("timestamp", "xid_errors"):
                continue
            if name == "mig_enabled":  # not in the exporter's families: unknown, not False
                assert row[name] is None
                continue
            assert _close(row[name], value), (reading.node, reading.gpu, name, row[name], value)
            compared += value is not None
        assert row["job_id"] == "frozen-train"
        assert row["user"] == "alice"
    assert compared > 8 * 30  # most fields of every GPU, not a few


def vars_of(reading: GpuReading) -> dict[str, Any]:
    return {name: getattr(reading, name) for name in reading.__dataclass_fields__}


def test_dcgm_families_read_through_the_same_field_table(stack: Stack) -> None:
    gl, dcgm = reader(stack.prom_gl), reader(stack.prom_dcgm)
    ours = {r.uuid: r for r in gl.latest_readings() if r.node in NODES}
    theirs = dcgm.latest_readings()
    assert {(r.node, r.gpu, r.uuid, r.model) for r in theirs} == {
        (r.node, r.gpu, r.uuid, r.model) for r in ours.values()
    }
    for r in theirs:
        total = ours[r.uuid].memory_total_bytes
        assert r.memory_total_bytes is not None
        assert total is not None
        assert math.isclose(r.memory_total_bytes, total, rel_tol=0.02)
        assert r.sm_clock_hertz is not None
        assert r.sm_clock_hertz > 1e9
        assert r.utilization_ratio is not None
        assert 0 <= r.utilization_ratio <= 1
    one = dcgm.latest_readings(node="node-01")  # selected in PromQL by the Hostname label
    assert [(r.node, r.gpu) for r in one] == [("node-01", i) for i in range(4)]
    jobs = dcgm.current_jobs()
    assert {(j.uuid, j.job_id) for j in jobs} == {(uuid, "llm-pretrain") for uuid in ours}  # from hpc_job
    with pytest.raises(NotAvailableOnBackend, match=r"^GPU processes: not available on Prometheus \(it holds"):
        dcgm.current_processes()
    processes = gl.current_processes()
    assert len(processes) > 0  # the gpulens exporters export their processes
    # the stalled exporter runs with --process-pids: each process; the frozen one, by default: each job on a GPU
    assert all(p.pid > 0 and p.command for p in processes if p.node in NODES)
    frozen = [p for p in processes if p.node in FROZEN_NODES]
    assert frozen
    assert all(p.pid == 0 and p.command is None and p.job_id == "frozen-train" for p in frozen)


def test_one_query_per_field_whatever_the_gpu_count(stack: Stack) -> None:
    gl = reader(stack.prom_gl)
    readings = gl.latest_readings()
    uuids = [r.uuid for r in readings]
    live = {r.uuid for r in readings if r.node in NODES}  # the frozen exporter's energy does not grow
    gl.present_names()  # its list of metric names read now, not inside the count
    before = gl.client.stats.queries
    now = time.time()
    data = gl.series(uuids, ["utilization_ratio", "power_watts", "energy_joules_total"], now - 20, now, 10)
    assert gl.client.stats.queries - before == 3
    assert set(data) == set(uuids)
    for uuid, series in data.items():
        assert series.step_seconds == 3.0
        assert all(t % 3 == 0 for t in series.timestamps)
        assert all(lo <= mean <= hi for lo, mean, hi in zip(*(
            getattr(series, k)["power_watts"] for k in ("minimum", "values", "maximum")), strict=True
        ) if lo is not None and mean is not None and hi is not None)  # fmt: skip
        rates = [v for v in series.values["energy_joules_total"] if v is not None]
        assert rates, (uuid, series.timestamps, series.values["energy_joules_total"])
        assert all(10 < v < 10_000 if uuid in live else v == 0 for v in rates)


def test_a_query_over_the_series_limit_says_so(stack: Stack) -> None:
    small = reader(stack.prom_gl, max_series=5)
    with pytest.raises(TooManySeriesError, match=r"over the limit of 5 \(\[database\] max_series\)"):
        small.latest_readings()


def test_alerts_run_fires_the_stall_over_both_sources_and_delivers_it(stack: Stack) -> None:
    for source in ("gl", "dcgm"):
        try:
            alerts = wait_until(lambda s=source: fired(f"/{s}", "CommunicationStall"), 150, f"the stall ({source})")
        except AssertionError as timed_out:
            raise AssertionError(f"{timed_out}; its engine:\n{stack.engine_report(source)}") from None
        assert {a["labels"]["job_id"] for a in alerts} == {"llm-pretrain"}
        assert len({a["fingerprint"] for a in alerts}) == 1  # one alert for the job, not one per GPU or node
        delivered = {a["labels"]["alertname"] for p in Hook.payloads[f"/{source}"] for a in p["alerts"]}
        # nothing else goes wrong in this scenario; the Watchdog, always firing, reaches webhooks
        assert delivered == {"CommunicationStall", "Watchdog"}


def test_dashboard_pages_render_with_data_in_chromium(stack: Stack) -> None:
    from gpulens.dashboard.app import create_app
    from tests.dashboard.browser import chromium, serving, wait_rendered

    gl = reader(stack.prom_gl)
    uuid = next(r.uuid for r in gl.latest_readings() if r.node == "node-00")
    app = create_app(gl)
    pages = {
        "/": "node-00",
        "/jobs": "llm-pretrain",
        "/jobs/llm-pretrain": "node-01",
        "/nodes/node-00": "python",  # its processes, from gpulens_process_gpu_memory_bytes
        f"/gpus/{uuid}": "node-00",
        "/interconnect": "eq-00:0",  # the first node, and its GPUs in the link-error table
    }
    with serving(app) as base, chromium() as browser:
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
    dcgm_app = create_app(reader(stack.prom_dcgm))
    with serving(dcgm_app) as base, chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(base + "/nodes/node-01")
        wait_rendered(page)
        assert "GPU processes: not available on this backend" in page.inner_text("body")


def test_commands_that_write_refuse_a_prometheus_url(tmp_path: Path) -> None:
    for args in (
        ["collector", "--db", "prometheus+http://127.0.0.1:9", "--target", "http://127.0.0.1:1"],
        ["db", "upgrade", "--db", "prometheus+http://127.0.0.1:9"],
        ["simulate", "examples/scenarios/stall.toml", "--db", "prometheus+http://127.0.0.1:9"],
    ):
        out = run_gpulens(*args)
        assert out.returncode != 0
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1, out.stderr
        assert "gpulens reads but never writes" in lines[0]
        assert "docs/prometheus.md" in lines[0]


def test_credentials_come_from_the_environment_and_never_the_url() -> None:
    with_password = PromReader(
        "prometheus+http://127.0.0.1:9", environ={"GPULENS_DB_USERNAME": "ops", "GPULENS_DB_PASSWORD": "s3cret"}
    )
    assert with_password.scrub("failed for s3cret") == "failed for ***"
    assert with_password.client._headers["Authorization"].startswith("Basic ")
    token = PromReader("prometheus+https://prom.example:443/prom", environ={"GPULENS_DB_BEARER_TOKEN": "tok-1"})
    assert token.client._headers["Authorization"] == "Bearer tok-1"
    assert token.client.base == "https://prom.example:443/prom"
    mimir = PromReader("prometheus+http://mimir:8080/prometheus", StoreAuth(tenant="team-a"), environ={})
    assert mimir.client._headers["X-Scope-OrgID"] == "team-a"
    assert "Authorization" not in mimir.client._headers
    with pytest.raises(ConfigError, match="not the URL"):
        PromReader("prometheus+http://ops:pw@127.0.0.1:9", environ={})


def test_silences_over_prometheus_live_in_the_alert_state_store(stack: Stack, tmp_path: Path) -> None:
    config = tmp_path / "gpulens.toml"
    config.write_text(f'[database]\nstate_url = "sqlite:///{tmp_path / "state.db"}"\n')
    db = ["--config", str(config), "--db", "prometheus+" + stack.prom_gl]
    added = run_gpulens("silence", "add", *db, "--match", "node=node-01", "--duration", "1h", "--comment", "repairs")
    assert added.returncode == 0, added.stderr
    listed = run_gpulens("silence", "list", *db, "--json")
    assert listed.returncode == 0, listed.stderr
    assert [s["comment"] for s in json.loads(listed.stdout)] == ["repairs"]
    assert (tmp_path / "state.db").exists()


def test_gpulens_dashboard_serves_over_prometheus(stack: Stack, tmp_path: Path) -> None:
    from tests.conftest import free_port, http_get
    from tests.storage.promstack import gpulens, process, wait_http

    port = free_port()
    log = tmp_path / "dashboard.log"
    proc = gpulens(
        "dashboard", "--config", str(stack.config_gl), "--db", "prometheus+" + stack.prom_gl,
        "--listen", f"127.0.0.1:{port}", log=log,
    )  # fmt: skip
    with process(proc, log):
        wait_http(f"http://127.0.0.1:{port}/healthz", proc, log)
        status, _, body = http_get(f"http://127.0.0.1:{port}/_dash-layout")
        assert status == 200
        assert b"prometheus" in body  # the shell names the store it reads ("+" comes JSON-escaped)
    assert "reading prometheus+http://127.0.0.1" in log.read_text()


def test_query_series_jobs_and_targets_over_prometheus(stack: Stack) -> None:
    db = ["--db", "prometheus+" + stack.prom_gl, "--config", str(stack.config_gl)]  # min_step 1s
    uuid = next(r.uuid for r in reader(stack.prom_gl).latest_readings(node="node-00"))
    series = run_gpulens("query", "series", *db, "--gpu", uuid, "--field", "power_watts", "--since", "1m", "--json")
    assert series.returncode == 0, series.stderr
    rows = json.loads(series.stdout)
    assert rows
    assert {r["uuid"] for r in rows} == {uuid}
    assert all(r["power_watts"] > 0 for r in rows)
    jobs = run_gpulens("query", "jobs", *db, "--since", "5m", "--json")
    assert jobs.returncode == 0, jobs.stderr
    by_id = {j["job_id"]: j for j in json.loads(jobs.stdout)}
    assert set(by_id) == {"llm-pretrain", "frozen-train"}
    assert by_id["llm-pretrain"]["gpus"] == 8
    assert by_id["llm-pretrain"]["nodes"] == 2
    assert by_id["llm-pretrain"]["gpu_hours"] > 0
    targets = run_gpulens("query", "targets", *db, "--json")
    assert targets.returncode == 0, targets.stderr
    health = json.loads(targets.stdout)
    assert {t["target"].split("/")[0] for t in health} == {*NODES, *FROZEN_NODES}  # Prometheus's scrape jobs
    assert all(t["up"] for t in health)


def test_job_summaries_agree_with_the_sql_path_on_the_same_scrape(stack: Stack) -> None:
    """The frozen job over the last 5 minutes (raw samples in SQL), stored by the collector and scraped by
    Prometheus: the same GPUs, nodes and user; the same utilization and memory within 1 %."""
    now = time.time()
    sql = SqlReader(open_existing_database(stack.sql_url))
    try:
        stored = {j.job_id: j for j in sql.jobs(now - 300, now)}["frozen-train"]
    finally:
        sql.close()
    prom = reader(stack.prom_gl)
    read = {j.job_id: j for j in prom.jobs(now - 300, now)}["frozen-train"]
    assert (read.gpus, read.nodes, read.user) == (stored.gpus, stored.nodes, stored.user)
    assert len(read.gpus) == 8
    assert stored.utilization_ratio_mean is not None
    assert stored.memory_used_bytes_mean is not None
    assert read.utilization_ratio_mean == pytest.approx(stored.utilization_ratio_mean, abs=0.01)
    assert read.utilization_ratio_stddev == pytest.approx(stored.utilization_ratio_stddev, abs=0.01)
    assert read.memory_used_bytes_mean == pytest.approx(stored.memory_used_bytes_mean, rel=0.01)
    assert read.memory_used_bytes_max == pytest.approx(stored.memory_used_bytes_max, rel=0.01)
    # GPU-hours: the frozen exporter stamps its readings with its scenario's (nearly stopped) clock, so the SQL
    # path's hours are not comparable here; Prometheus's count the steps its scrapes held the job (at most all 8
    # GPUs over the range and one step). tests/storage/test_prometheus_scale.py checks them step by step.
    step = prom._step(now - 300, now, JOB_POINTS + 1)[2]
    assert 0 < read.gpu_hours <= 8 * (300 + step) / 3600


@pytest.mark.parametrize("page", ["current.prom", "legacy.prom"])
def test_every_dcgm_exporter_generation_reads_as_its_page_does(page: str, prometheus_bin: str, tmp_path: Path) -> None:
    """A dcgm-exporter page (4.6+ base-unit names, or 2.x-4.5 names) read through Prometheus gives the records that
    reading the page itself gives (gpulens.dcgmpage), but for the sample time."""
    import dataclasses
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from gpulens.dcgmpage import parse_dcgm_metrics
    from tests.prom import running_prometheus

    text = (Path(__file__).parents[1] / "fixtures" / "dcgm" / page).read_text()

    class Page(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    expected = parse_dcgm_metrics(text, node=None, timestamp=0.0)
    try:
        target = f"127.0.0.1:{server.server_address[1]}"
        with running_prometheus(prometheus_bin, tmp_path, {"dcgm": (target, "/metrics")}) as base:
            wait_for(base, "up", lambda r: bool(r) and r[0]["value"][1] == "1")
            store = reader(base)
            got = wait_until(lambda: store.latest_readings(), 30, "the page's GPUs in Prometheus")
            jobs = store.current_jobs()
            node = expected.gpus[0].node  # from the page's hostname (4.6+) or Hostname (earlier) label
            assert [r.uuid for r in store.latest_readings(node=node)] == [r.uuid for r in got]
            assert store.latest_readings(node="elsewhere") == []
    finally:
        server.shutdown()
        server.server_close()
    assert expected.gpus
    assert [dataclasses.replace(r, timestamp=0.0) for r in got] == list(expected.gpus)
    assert sorted((j.uuid, j.job_id) for j in jobs) == sorted((j.uuid, j.job_id) for j in expected.jobs)


def test_answers_decode_every_value_prometheus_writes() -> None:
    """The fast decoder reads values as floats; an answer holding "+Inf" (which it refuses) is read value by value,
    with the same series, labels and samples."""
    import msgspec

    client = PromReader("prometheus+http://127.0.0.1:9").client
    matrix = {
        "resultType": "matrix",
        "result": [
            {"metric": {"uuid": "GPU-a"}, "values": [[1.5, "0.25"], [2.5, "NaN"]]},
            {"metric": {"uuid": "GPU-b"}, "values": [[1.5, "-Inf"], [2.5, "1e3"]]},
        ],
    }
    fast = client._series(msgspec.Raw(json.dumps(matrix).encode()), None, "q")
    assert [dict(s.labels) for s in fast] == [{"uuid": "GPU-a"}, {"uuid": "GPU-b"}]
    assert fast[0].samples[0] == (1.5, 0.25)
    assert math.isnan(fast[0].samples[1][1])
    assert fast[1].samples == ((1.5, -math.inf), (2.5, 1000.0))
    matrix["result"][1]["values"][0][1] = "+Inf"  # type: ignore[index]
    slow = client._series(msgspec.Raw(json.dumps(matrix).encode()), None, "q")
    assert slow[1].samples == ((1.5, math.inf), (2.5, 1000.0))
    assert slow[0].samples[0] == (1.5, 0.25)
    assert math.isnan(slow[0].samples[1][1])
    vector = {"resultType": "vector", "result": [{"metric": {}, "value": [3.0, "+Inf"]}]}
    assert client._series(msgspec.Raw(json.dumps(vector).encode()), None, "q")[0].samples == ((3.0, math.inf),)
    scalar = {"resultType": "scalar", "result": [3.0, "7"]}
    assert client._series(msgspec.Raw(json.dumps(scalar).encode()), None, "q")[0].value == 7.0


def test_a_regex_of_values_matches_exactly_them_in_prometheus(promtool: str, tmp_path: Path) -> None:
    """``regex_of`` escapes only what RE2 treats as special (an alternation of plain literals is looked up as a set:
    UUIDs and node names need no escape at all), and Prometheus's own engine matches exactly the values given."""
    import subprocess

    import yaml

    from gpulens.storage.prometheus.client import quote, regex_escape, regex_of

    assert regex_escape("GPU-0a1b2c3d-0000-4e5f") == "GPU-0a1b2c3d-0000-4e5f"
    wanted = ["GPU-0a1b", "node.01", "a+b", "x#y&z~ w", "(p)|[q]{r}^$s\\t", "c*d?", "node-02"]
    decoys = ["nodeX01", "aab", "ab", "p", "ccd", "c", "node-021", "xnode-02"]  # each matched by a careless pattern
    series = [{"series": f"m{{v={quote(v)}}}", "values": "1"} for v in (*wanted, *decoys)]
    selector = f"m{{v=~{regex_of(wanted)}}}"
    tests = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {"expr": f"count({selector})", "eval_time": "0m", "exp_samples": [{"value": len(wanted)}]},
                    {
                        "expr": f"count(m{{v!~{regex_of(wanted)}}})",
                        "eval_time": "0m",
                        "exp_samples": [{"value": len(decoys)}],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "regex_test.yml"
    path.write_text(yaml.safe_dump(tests))
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_name_list_read_while_a_target_first_appears_is_read_again_soon() -> None:
    """Prometheus lists a new target's metric names as it appends its first scrape: a list read then can lack some.
    A list that changed is trusted for NAMES_CHANGED_TTL_S, one that held still for NAMES_TTL_S."""
    from gpulens.storage.prometheus.reader import NAMES_CHANGED_TTL_S, NAMES_TTL_S

    class Clock:
        t = 1000.0

        def now(self) -> float:
            return self.t

        def monotonic(self) -> float:
            return self.t

    clock = Clock()
    store = PromReader("prometheus+http://127.0.0.1:9", clock=clock)
    listed = [{"up"}, {"up", "DCGM_FI_DEV_GPU_UTIL"}, {"up", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_NVLINK_TX_BYTES"}]
    reads: list[float] = []

    def metric_names(start: float, end: float) -> set[str]:
        reads.append(clock.t)
        return listed[min(len(reads), len(listed)) - 1]

    store.client.metric_names = metric_names  # type: ignore[method-assign]
    assert not store._exists("DCGM_FI_DEV_GPU_UTIL")  # no GPU yet: nothing kept, asked again next time
    clock.t += 1
    assert store._exists("DCGM_FI_DEV_GPU_UTIL")
    assert not store._exists("DCGM_FI_PROF_NVLINK_TX_BYTES")  # a partial list, kept
    clock.t += NAMES_CHANGED_TTL_S
    assert store._exists("DCGM_FI_PROF_NVLINK_TX_BYTES")  # read again within NAMES_CHANGED_TTL_S, complete now
    clock.t += NAMES_CHANGED_TTL_S
    assert store._exists("DCGM_FI_PROF_NVLINK_TX_BYTES")  # the same list: held still, trusted for NAMES_TTL_S
    clock.t += NAMES_TTL_S - 1
    store._exists("up")
    assert reads == [1000.0, 1001.0, 1001.0 + NAMES_CHANGED_TTL_S, 1001.0 + 2 * NAMES_CHANGED_TTL_S]
    clock.t += 1
    store._exists("up")
    assert len(reads) == 5


def test_an_incidents_gpu_culprit_gets_its_pci_address_from_prometheus(stack: Stack) -> None:
    """``gpulens alerts run`` over Prometheus asks the store for a GPU culprit's address (``culpritaddress``): the
    ``pci_bus_id`` of ``gpulens_gpu_info``, the same the SQL path stored."""
    from gpulens.alerts.culpritaddress import from_store

    sql = SqlReader(open_existing_database(stack.sql_url))
    try:
        stored = {g.uuid: g.pci_bus_id for g in sql.gpu_info() if g.node in FROZEN_NODES}
    finally:
        sql.close()
    assert len(stored) == 8
    assert all(stored.values())
    prom = reader(stack.prom_gl)
    try:
        assert from_store(prom)(sorted(stored)) == stored
    finally:
        prom.close()
