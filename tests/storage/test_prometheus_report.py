"""``gpulens report`` and the Reports page's reads over Prometheus, against the SQL path on the same exporters.

A simulated exporter, its scenario's clock running at the wall clock's pace from its start, serves two nodes: alice's
training job holds four GPUs of rp-00, bob's idle allocation two of rp-01. A collector stores them in SQLite and a
real Prometheus scrapes them, both every second, both started before the exporter. Once each has 30 samples of every
GPU, the report over the period since before the jobs began lists the same users with the same GPU-hours within a
tolerance (a scrape or two apart at either end), alice's GPUs busy and bob's idle, and energy from the power.
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import pytest

from gpulens.settings import Prices, StoreAuth
from gpulens.storage.connect import open_existing_database
from gpulens.storage.prometheus import PromReader
from gpulens.storage.sqlreader import SqlReader
from tests.conftest import free_port, http_get
from tests.prom import running_prometheus
from tests.storage.promstack import _exporter, _serving, gpulens, process, run_gpulens, wait_http

NODES = ("rp-00", "rp-01")
SCENARIO = """
[cluster]
nodes = ["rp-00", "rp-01"]
gpus_per_node = 4
gpu_model = "H100-SXM5-80GB"
seed = 5
start = "{start}"
duration = "60m"
step = "1s"

[[jobs]]
id = "train"
user = "alice"
kind = "training"
gpus = ["rp-00:0-3"]

[[jobs]]
id = "parked"
user = "bob"
kind = "idle"
gpus = ["rp-01:0-1"]
"""
SAMPLES = 30
PRICES = Prices(per_gpu_hour=2.0, currency="EUR")


@dataclass
class Both:
    began: float  # before the exporter started: the report's period begins here
    sql_url: str
    prom: str  # prometheus+http://...


def _count(prom: str, promql: str) -> float:
    status, _, body = http_get(f"{prom}/api/v1/query?query={urllib.parse.quote(promql)}", timeout=5)
    result = json.loads(body)["data"]["result"] if status == 200 else []
    return float(result[0]["value"][1]) if result else 0.0


def _sql_samples(url: str) -> int:
    try:
        sql = SqlReader(open_existing_database(url))
    except Exception:  # noqa: BLE001 (the collector has not created it yet)
        return 0
    try:
        readings = {r.uuid: r for r in sql.latest_readings()}
        return len(readings)
    finally:
        sql.close()


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory, prometheus_bin: str) -> Iterator[Both]:
    root = tmp_path_factory.mktemp("promreport")
    began = time.time() - 5
    port = free_port()
    with ExitStack() as stack:
        # Prometheus and the collector first, the exporter last: both see the jobs from their first sample on.
        jobs = {n: (f"127.0.0.1:{port}", f"/node/{n}/metrics") for n in NODES}
        prom = stack.enter_context(running_prometheus(prometheus_bin, root, jobs))
        sql_url = f"sqlite:///{root / 'gpulens.db'}"
        targets = [arg for n in NODES for arg in ("--target", f"http://127.0.0.1:{port}/node/{n}")]
        log = root / "collector.log"
        listen = f"127.0.0.1:{free_port()}"
        spool = ["--spool-dir", str(root / "spool")]
        proc = gpulens("collector", "--db", sql_url, *targets, "--interval", "1s", "--listen", listen, *spool, log=log)
        stack.enter_context(process(proc, log))
        wait_http(f"http://{listen}/metrics", proc, log)  # its store ready and its targets tried every second
        start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time()))
        _serving(stack, root, "sim", _exporter(root, "sim", SCENARIO.format(start=start), 1, port), port)
        deadline = time.monotonic() + 180
        query = "min(count_over_time(gpulens_gpu_utilization_ratio[5m]))"
        while _count(prom, query) < SAMPLES or _sql_samples(sql_url) < 8:
            assert time.monotonic() < deadline, (root / "collector.log").read_text()[-2000:]
            time.sleep(1)
        yield Both(began, sql_url, "prometheus+" + prom)


def test_the_report_over_prometheus_agrees_with_the_sql_path(both: Both) -> None:
    end = time.time()
    sql = SqlReader(open_existing_database(both.sql_url))
    try:
        stored = {r.group: r for r in sql.usage("user", both.began, end, PRICES)}
    finally:
        sql.close()
    prom = PromReader(both.prom, StoreAuth(min_step_s=1.0))
    try:
        read = {r.group: r for r in prom.usage("user", both.began, end, PRICES)}
        trend = prom.idle_trend("user", both.began, end, 300.0, PRICES)
    finally:
        prom.close()
    assert set(read) == set(stored) == {"alice", "bob"}
    for user, gpus in (("alice", 4), ("bob", 2)):
        assert read[user].jobs == stored[user].jobs == 1
        assert read[user].gpu_hours == pytest.approx(stored[user].gpu_hours, rel=0.2)
        assert read[user].gpu_hours > gpus * SAMPLES / 3600 * 0.9
        assert read[user].cost == pytest.approx(read[user].gpu_hours * 2.0)
        assert read[user].energy_kwh is not None
        assert read[user].energy_kwh > 0
    assert read["alice"].idle_ratio is not None
    assert read["alice"].idle_ratio < 0.1
    assert read["bob"].idle_ratio == pytest.approx(1.0)
    assert stored["bob"].idle_ratio == pytest.approx(1.0)
    assert read["alice"].used_gpu_hours == pytest.approx(read["alice"].gpu_hours * (1 - read["alice"].idle_ratio))
    samples = {p.group: (p.samples, p.idle_samples) for p in trend}
    assert set(samples) == {"alice", "bob"}
    assert samples["bob"][0] == samples["bob"][1] > 0  # every sample of bob's GPUs idle


def test_the_report_adds_one_query_per_sum_to_the_jobs_read_whatever_the_jobs(both: Both) -> None:
    end = time.time()
    prom = PromReader(both.prom, StoreAuth(min_step_s=1.0))
    calls: list[str] = []
    query, query_range = prom.client.query, prom.client.query_range

    def counted_query(promql: str, at: float, **kw: Any) -> Any:
        calls.append(promql)
        return query(promql, at, **kw)

    def counted_range(promql: str, *args: Any, **kw: Any) -> Any:
        calls.append(promql)
        return query_range(promql, *args, **kw)

    prom.client.query, prom.client.query_range = counted_query, counted_range  # type: ignore[method-assign]
    try:
        assert len(prom.usage("user", both.began, end, PRICES)) == 2
    finally:
        prom.close()
    # Beside the jobs page's read (PromReader.jobs): utilization samples, idle ones and energy, each one query over
    # every job and GPU; the stall steps only where Prometheus holds ALERTS (it evaluates no rules here).
    own = [q for q in calls if "group_left ()" in q or "ALERTS" in q]
    assert len(own) == 3
    assert all(re.search(r"\[\d+s:\d+s\]", q) for q in own)  # a subquery over the period at the jobs' step


def test_the_command_prints_the_report_over_prometheus(both: Both) -> None:
    out = run_gpulens("report", "--by", "user", "--since", "1h", "--json", "--db", both.prom)
    assert out.returncode == 0, out.stderr
    rows = {r["group"]: r for r in json.loads(out.stdout)}
    assert set(rows) == {"alice", "bob"}
    assert rows["alice"]["gpu_hours"] > rows["bob"]["gpu_hours"] > 0


def test_the_reports_page_renders_over_prometheus(both: Both) -> None:
    from gpulens.clock import SystemClock
    from gpulens.dashboard.components import ViewState
    from gpulens.dashboard.context import Context
    from gpulens.dashboard.pages import reports

    prom = PromReader(both.prom, StoreAuth(min_step_s=1.0))
    try:
        context = Context(prom, SystemClock(), prices=PRICES)
        status, rows, trend, _ = reports.render(context, ViewState.from_query({"range": "15m"}), "user")
    finally:
        prom.close()
    assert status is None  # neither "not available" nor "no jobs"
    assert "alice" in str(rows)
    assert "bob" in str(rows)
    assert sorted(t.name for t in trend.data) == ["alice", "bob", "overall"]
