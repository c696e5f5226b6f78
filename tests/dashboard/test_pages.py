"""The pages' server side over a real SQLite database: what each page shows, in full, empty and broken states, and
how large its payload is; basic auth; ``run_dashboard``. (What a browser makes of it is in test_browser.py.)
"""

from __future__ import annotations

import contextvars
import gzip
import http.client
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import pytest
from dash.development.base_component import Component
from plotly.io.json import to_json_plotly
from sqlalchemy import event

from gpulens.alerts.remediationcase import DrainRecord
from gpulens.clock import ManualClock
from gpulens.config import ConfigError
from gpulens.dashboard.app import create_app
from gpulens.dashboard.components import ViewState
from gpulens.dashboard.context import Context, PageError
from gpulens.dashboard.pages import alerts, gpu, interconnect, job, jobs, node, overview
from gpulens.dashboard.server import load_basic_auth_file, run_dashboard
from gpulens.model import JobInfo
from gpulens.storage import slurmtables
from gpulens.storage.db import Database
from gpulens.storage.inventory import history_start
from gpulens.storage.slurmtables import record_drain_action, write_job_info
from gpulens.webauth import BasicAuth
from tests.conftest import free_port, http_get
from tests.dashboard.cluster import IDLE_JOB, STALLED_JOB, STRAGGLING_JOB
from tests.dashboard.conftest import Store
from tests.dbtemplate import migrated_sqlite

MAX_PAYLOAD_BYTES = 1_000_000
PASSWORD = "s3cret-Pa55word"


def text_of(value: Any) -> str:
    """Every string a page would show, in order (component trees, lists and figures' annotation texts)."""
    if isinstance(value, Component):
        return text_of(value.to_plotly_json()["props"])
    if isinstance(value, dict):
        return " ".join(
            text_of(v)
            for k, v in value.items()
            if k in ("children", "figure", "layout", "annotations", "text") or k.isdigit()
        )
    if isinstance(value, list | tuple):
        return " ".join(text_of(v) for v in value)
    if isinstance(value, str):
        return value
    if hasattr(value, "to_plotly_json"):  # a figure
        return text_of(value.to_plotly_json())
    return ""


def find_figures(value: Any) -> dict[str, dict[str, Any]]:
    """id -> figure of every graph in a component tree."""
    found: dict[str, dict[str, Any]] = {}
    if isinstance(value, Component):
        props = value.to_plotly_json()["props"]
        if "figure" in props:
            found[props["id"]] = props["figure"].to_plotly_json()
        found.update(find_figures(props.get("children")))
    elif isinstance(value, list | tuple):
        for item in value:
            found.update(find_figures(item))
    return found


def context_of(store: Store, **changes: Any) -> Context:
    return Context(db=store.db, clock=store.clock, alerts=changes.pop("alerts", store.filled.alerts), **changes)


def payload_bytes(outputs: tuple[Any, ...]) -> int:
    """What Dash sends for a callback's outputs: the same JSON encoder."""
    return len(to_json_plotly(list(outputs)).encode())


def render_all(context: Context, state: ViewState) -> dict[str, tuple[Any, ...]]:
    return {
        "overview": overview.render(context, state, "utilization", "name", "", 1),
        "jobs": jobs.render(context, state, "all", "", 1),
        "job": job.render(context, state, STALLED_JOB),
        "node": node.render(context, state, "node-02"),
        "gpu": gpu.render(context, state, gpu_uuid(context, "node-02", 2)),
        "interconnect": interconnect.render(context, state, "node-00"),
        "alerts": alerts.render(context, state),
    }


def gpu_uuid(context: Context, node_name: str, index: int) -> str:
    from gpulens.storage.inventory import gpu_info

    return next(g.uuid for g in gpu_info(context.db) if (g.node, g.gpu) == (node_name, index))


# --- with data ------------------------------------------------------------------------------------------------------


def test_overview_shows_the_cluster(store: Store) -> None:
    status, cards, _map, map_style, heatmap, info, *_rest, targets, updated = overview.render(
        context_of(store), ViewState(), "utilization", "name", "", 1
    )
    card_text = {c.children[0].children: c.children[1].children for c in cards}
    assert card_text["GPUs"] == "36"
    assert card_text["Up"] == "27"  # 36 - node-04's 8 (exporter down) - node-02:7 (lost)
    firing = [a.rule for a in store.filled.alerts.active() if a.state == "firing"]
    assert "Watchdog" in firing  # the heartbeat fires, but is not counted
    assert card_text["Alerts firing"] == str(len(firing) - 1)
    assert "1 of 5 scrape targets down" in text_of(status)
    assert map_style == {"display": "none"}  # 5 nodes fit one page: no cluster map
    assert heatmap.to_plotly_json()["data"][0]["y"] == [f"node-0{i}" for i in range(5)]
    assert info == "nodes 1 to 5 of 5 · page 1/1"
    assert "node-04" in text_of(targets)
    assert updated.startswith("as of 2026-01-01 00:59 UTC")


def test_jobs_page_flags_the_stalled_straggling_and_idle_jobs(store: Store) -> None:
    _status, table, *_ = jobs.render(context_of(store), ViewState(), "flagged", "", 1)
    rows = table.children[1].children[0].children[1].children
    flagged = {row.children[0].children.children: text_of(row.children[-1]) for row in rows}
    assert flagged == {STALLED_JOB: "stalled", STRAGGLING_JOB: "straggling", IDLE_JOB: "idle"}


def test_the_jobs_table_sends_its_first_rows_flagged_first_and_says_how_to_find_the_others() -> None:
    from gpulens.storage.records import JobSummary

    summaries = [
        JobSummary(f"job-{i:03d}", "alice", ("GPU-a",), ("n1",), 0.0, 60.0, float(i), 0.5, 0.1, 1.0, 1, "raw")
        for i in range(jobs.MAX_ROWS + 20)
    ]
    flags = {"job-000": {"stalled": True}}  # the fewest GPU-hours, but flagged
    table = jobs.jobs_table(summaries, flags, "all", "", ViewState())
    rows = table.children[1].children[0].children[1].children
    shown = [row.children[0].children.children for row in rows]
    assert len(shown) == jobs.MAX_ROWS
    assert shown[:3] == ["job-000", f"job-{jobs.MAX_ROWS + 19:03d}", f"job-{jobs.MAX_ROWS + 18:03d}"]
    order = "flagged first, then by GPU-hours: filter by job, user or flag"
    assert text_of(table.children[0]) == f"showing {jobs.MAX_ROWS} of {jobs.MAX_ROWS + 20}, {order}"
    narrowed = jobs.jobs_table(summaries, flags, "all", "job-01", ViewState())
    assert text_of(narrowed.children[0]) == "10 jobs"


def test_job_page_marks_the_stall_on_its_charts(store: Store) -> None:
    status, info, charts, _gpus, alerts_part, _fabric, _ = job.render(context_of(store), ViewState(), STALLED_JOB)
    assert "stalled" in text_of(info)
    assert "16 GPUs on 2 node(s)" in text_of(info)
    assert "16 GPUs at 100% with no NVLink traffic" in text_of(status)
    figures_by_id = find_figures(charts)
    assert set(figures_by_id) == {"job-chart-utilization", "job-chart-nvlink", "job-chart-power"}
    for figure in figures_by_id.values():
        stall = [a for a in figure["layout"]["annotations"] if a["text"] == "stall"]
        assert len(stall) == 1
        assert len(figure["data"][0]["y"]) == 16
    assert "CommunicationStall" in text_of(alerts_part)


def test_node_and_gpu_pages_chart_every_metric(store: Store) -> None:
    context = context_of(store)
    _status, info, gpus_table, charts, processes, node_alerts, _ = node.render(context, ViewState(), "node-02")
    assert "vision-finetune" in text_of(gpus_table)
    assert info.startswith("8 x NVIDIA H100 80GB HBM3")
    assert len(find_figures(charts)) == 10
    assert "vllm" in text_of(processes)
    assert "JobStraggler" in text_of(node_alerts)
    uuid = gpu_uuid(context, "node-02", 2)
    _status, heading, facts, gpu_charts, _procs, gpu_alerts, _ = gpu.render(context, ViewState(), uuid)
    assert heading == "GPU node-02:2"
    assert "sw_thermal" in text_of(facts)
    throttle = find_figures(gpu_charts)["gpu-chart-throttle"]
    assert [t["name"] for t in throttle["data"]] == ["sw_thermal"]
    assert "GpuThermalThrottling" in text_of(gpu_alerts)


def test_interconnect_shows_degraded_links_and_errors(store: Store) -> None:
    _status, load, options, chosen, _topology, degraded, errors, _fabric, _note, _ = interconnect.render(
        context_of(store), ViewState(), None
    )
    assert chosen == "node-00"
    assert [o["value"] for o in options] == [f"node-0{i}" for i in range(5)]
    assert "PCIe Gen3 x8 (max Gen5 x16)" in text_of(degraded)
    assert "node-01:6" in text_of(degraded)
    assert "node-00:5" in text_of(errors)  # the NVLink error burst
    density = load.to_plotly_json()["data"][0]
    assert sum(n for row in density["z"] for n in row if n) == 27  # every GPU up and fresh is counted


def test_alerts_page_lists_firing_alerts_history_and_silences(store: Store) -> None:
    status, now_part, history, silences, _drains, _ = alerts.render(context_of(store), ViewState())
    assert re.search(r"\d+ alert\(s\) firing", text_of(status))
    assert "CommunicationStall" in text_of(now_part)
    assert "NvlinkErrors" in text_of(history)  # resolved within the hour
    assert "alertname=GpuIdleAllocated" in text_of(silences)


@pytest.mark.parametrize("range_", ["1h", "7d"])
def test_every_payload_stays_under_a_megabyte(store: Store, range_: str) -> None:
    for page, outputs in render_all(context_of(store), ViewState(range=range_)).items():
        assert payload_bytes(outputs) < MAX_PAYLOAD_BYTES, page


# --- empty and broken states ----------------------------------------------------------------------------------------


def test_an_empty_database_says_no_data_yet(empty_db: Database) -> None:
    context = Context(db=empty_db, clock=empty_db.clock)
    status, cards, *_ = overview.render(context, ViewState(), "utilization", "name", "", 1)
    assert "No data yet." in text_of(status)
    assert "no alert store connected" in text_of(cards)
    assert "No data yet." in text_of(jobs.render(context, ViewState(), "all", "", 1)[0])
    assert "No data yet." in text_of(interconnect.render(context, ViewState(), None)[0])
    assert "No GPU of node 'node-00' is in the database." in text_of(node.render(context, ViewState(), "node-00")[0])
    assert "not in the database" in text_of(gpu.render(context, ViewState(), "GPU-none")[0])
    assert "No GPU held by job" in text_of(job.render(context, ViewState(), "nope")[0])
    assert "No alert store connected." in text_of(alerts.render(context, ViewState())[0])


def test_the_alerts_page_lists_drain_actions_taken_and_refused(empty_db: Database) -> None:
    t = empty_db.clock.now()
    record_drain_action(empty_db, DrainRecord(t, "slurm-drain", "node-07", "3", "XidError:79", "drained", "gpulens X"))
    record_drain_action(empty_db, DrainRecord(t + 1, "slurm-drain", "node-08", "1", "GpuLost", "refused-cooldown", "w"))
    drains = text_of(alerts.render(Context(db=empty_db, clock=empty_db.clock), ViewState())[4])
    assert drains.index("refused-cooldown") < drains.index("drained")  # newest first
    assert "node-07" in drains
    assert "XidError:79" in drains
    assert "gpulens X" in drains


def test_an_unreachable_database_is_said_without_its_password() -> None:
    db = Database(f"postgresql+psycopg://gpulens:{PASSWORD}@127.0.0.1:{free_port()}/gpulens", clock=ManualClock(0))
    try:
        context = Context(db=db, clock=db.clock)
        for render in (
            lambda: overview.render(context, ViewState(), "utilization", "name", "", 1),
            lambda: jobs.render(context, ViewState(), "all", "", 1),
            lambda: node.render(context, ViewState(), "node-00"),
            lambda: alerts.render(Context(db=db, clock=db.clock, alerts=_Unreachable(db)), ViewState()),
        ):
            with pytest.raises(PageError) as caught:
                render()
            shown = text_of(caught.value.banner)
            assert "Database unreachable." in shown
            assert PASSWORD not in shown
        shell = text_of(create_app(db).layout)
        assert "***" in shell
        assert PASSWORD not in shell
    finally:
        db.close()


class _Unreachable:
    """An alert store on the same unreachable database: it fails the way storage's reader does."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def active(self) -> Any:
        from gpulens.storage.inventory import target_health

        return target_health(self._db)

    def history(self, start: float, end: float) -> Any:
        return self.active()

    def silences(self, now: float) -> Any:
        return self.active()

    def open_incidents(self) -> Any:
        return self.active()

    def incidents(self, since: float) -> Any:
        return self.active()


def test_a_bad_custom_range_is_explained(store: Store) -> None:
    state = ViewState(range="custom", start="2026-01-01T01:00", end="2026-01-01T00:00")
    with pytest.raises(PageError) as caught:
        node.render(context_of(store), state, "node-00")
    assert "Bad time range." in text_of(caught.value.banner)
    assert "is not after the start" in text_of(caught.value.banner)


def test_an_unbounded_custom_range_is_clamped_to_the_stored_history(store: Store) -> None:
    """``0001-01-01..9999-12-31``: every page renders, and no read walks more minutes than the history holds (the
    per-minute walk SQLite's raw reads use would otherwise span ten thousand years)."""
    first = history_start(store.db)
    assert first is not None
    walked: list[float] = []

    def spans(conn: Any, cursor: Any, statement: str, params: Any, context: Any, executemany: bool) -> None:
        if "WITH RECURSIVE minutes" in statement and isinstance(params, dict):
            for key, lo in params.items():
                if key.startswith(("read_from", "lo")) and (
                    hi := params.get(key.replace("read_from", "hi").replace("lo", "hi"))
                ):
                    walked.append((hi - lo) / 60_000)

    state = ViewState(range="custom", start="0001-01-01T00:00", end="9999-12-31T23:59")
    event.listen(store.db.engine, "before_cursor_execute", spans)
    try:
        pages = render_all(context_of(store), state)
    finally:
        event.remove(store.db.engine, "before_cursor_execute", spans)
    history_minutes = (store.clock.now() - first) / 60
    assert walked  # the raw reads did run
    assert max(walked) <= history_minutes + 60  # plus a counter's lookback
    assert set(pages) == {"overview", "jobs", "job", "node", "gpu", "interconnect", "alerts"}


def test_a_target_down_greys_its_gpus(store: Store) -> None:
    heatmap = overview.render(context_of(store), ViewState(), "utilization", "name", "", 1)[4]
    overlay = heatmap.to_plotly_json()["data"][1]
    assert overlay["z"][4] == [0.0] * 8  # node-04: stale
    assert overlay["z"][2][7] == 1.0  # node-02:7: lost


# --- serving ----------------------------------------------------------------------------------------------------------


def hashed(password: str) -> bytes:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4))


def test_basic_auth_guards_everything_but_the_health_check(empty_db: Database) -> None:
    app = create_app(empty_db, basic_auth=BasicAuth({"ops": hashed("correct horse")}))
    client = app.server.test_client()
    denied = client.get("/")
    assert denied.status_code == 401
    assert denied.headers["WWW-Authenticate"] == 'Basic realm="gpulens"'
    assert client.get("/_dash-layout").status_code == 401
    assert client.get("/", auth=("ops", "wrong")).status_code == 401
    assert client.get("/", auth=("ops", "correct horse")).status_code == 200
    assert client.get("/healthz").status_code == 200


def test_unknown_and_known_users_cost_the_same_bcrypt_work(empty_db: Database) -> None:
    calls: list[bytes] = []

    def counting(password: bytes, hashed_: bytes) -> bool:
        calls.append(hashed_)
        return bcrypt.checkpw(password, hashed_)

    auth = BasicAuth({"ops": hashed("correct horse")}, checkpw=counting)
    client = create_app(empty_db, basic_auth=auth).server.test_client()
    for user in ("ops", "nobody", "root"):
        before = len(calls)
        assert client.get("/", auth=(user, "wrong")).status_code == 401
        assert len(calls) - before == 1, user
    assert calls[1] == calls[2] != calls[0]  # unknown users: the dummy hash, at the real hashes' cost
    assert calls[1].split(b"$")[2] == calls[0].split(b"$")[2]


def test_basic_auth_file(tmp_path: Path) -> None:
    good = tmp_path / "users"
    good.write_text(f"# operators\n\nops:{hashed('pw').decode()}\n", encoding="utf-8")
    assert set(load_basic_auth_file(good).users) == {"ops"}
    bad = tmp_path / "bad"
    bad.write_text(f"ops:{hashed('pw').decode()}\nalice:plaintext-password\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_basic_auth_file(bad)
    assert caught.value.line == 2
    assert "plaintext-password" not in str(caught.value)
    with pytest.raises(ConfigError, match="cannot read"):
        load_basic_auth_file(tmp_path / "missing")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    """``run_dashboard`` on a free port in a thread; yields its base URL and stops it."""
    database = tmp_path / "served.db"
    migrated_sqlite(database)
    announced: list[str] = []
    stop = threading.Event()
    port = free_port()
    # Dash keeps its page registry's state in a context variable set when dash is imported: a new thread must run
    # in a copy of this thread's context (the CLI runs in the main thread).
    context = contextvars.copy_context()
    thread = threading.Thread(
        target=context.run,
        args=(run_dashboard, f"sqlite:///{database}"),
        kwargs={"port": port, "announce": announced.append, "stop": stop},
    )
    thread.start()
    deadline = time.monotonic() + 30
    while not announced and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert announced, "run_dashboard did not start"
        yield announced[0]
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive()  # stopped within 5 s


def test_run_dashboard_serves_until_stopped(served: str) -> None:
    url = re.search(r"http://\S+/", served)
    assert url is not None
    status, _headers, body = http_get(url.group(0) + "healthz")
    assert (status, body) == (200, b"ok\n")
    status, _headers, body = http_get(url.group(0))
    assert status == 200
    assert b"_dash-config" in body


def header(headers: dict[str, str], name: str) -> str:
    return next((v for k, v in headers.items() if k.lower() == name.lower()), "")


@pytest.fixture
def held_open() -> Iterator[list[http.client.HTTPConnection]]:
    """Connections the test leaves open: closed only after the server (set up later) has been stopped."""
    connections: list[http.client.HTTPConnection] = []
    yield connections
    for connection in connections:
        connection.close()


def test_a_keep_alive_connection_does_not_hold_up_the_stop(
    held_open: list[http.client.HTTPConnection], served: str
) -> None:
    address = re.search(r"http://([^/:]+):(\d+)/", served)
    assert address is not None
    connection = http.client.HTTPConnection(address.group(1), int(address.group(2)), timeout=5)
    held_open.append(connection)
    connection.request("GET", "/healthz")
    response = connection.getresponse()
    assert (response.status, response.read()) == (200, b"ok\n")
    assert response.getheader("Connection", "keep-alive").lower() != "close"  # the fixture stops it within 5 s


def test_waitress_serves_gzip_and_immutable_versioned_assets(served: str) -> None:
    base = re.search(r"http://\S+/", served)
    assert base is not None
    status, headers, page = http_get(base.group(0))
    assert status == 200
    server = header(headers, "Server")
    assert server == "gpulens-dashboard"
    assert "werkzeug" not in server.lower()
    scripts = re.findall(r'src="(/_dash-component-suites/[^"]+\.js)"', page.decode())
    versioned = [s for s in scripts if re.search(r"\.v[\w-]+m[0-9a-f]+\.", s)]
    assert versioned, scripts
    for path in versioned[:3]:
        status, plain_headers, plain = http_get(base.group(0).rstrip("/") + path)
        assert status == 200
        assert header(plain_headers, "Content-Encoding") == ""
        status, gz_headers, packed = http_get(base.group(0).rstrip("/") + path, headers={"Accept-Encoding": "gzip"})
        assert status == 200
        assert header(gz_headers, "Content-Encoding") == "gzip"
        assert gzip.decompress(packed) == plain
        assert len(packed) < len(plain)
        assert header(gz_headers, "Cache-Control") == "public, max-age=31536000, immutable"
        assert "accept-encoding" in header(gz_headers, "Vary").lower()
    # an unversioned response is compressed too, but not cached for a year
    status, headers, body = http_get(base.group(0), headers={"Accept-Encoding": "gzip, deflate"})
    assert header(headers, "Content-Encoding") == "gzip"
    assert b"_dash-config" in gzip.decompress(body)
    assert "immutable" not in header(headers, "Cache-Control")


def test_the_job_page_names_the_job_as_slurm_does(store: Store) -> None:
    meta = JobInfo("node-00", STALLED_JOB, "pretrain-7b", "alice", "proj1", "gpu", "40", 1)
    with store.db.write_transaction() as conn:
        write_job_info(conn, [meta], store.clock.now())
    try:
        info = text_of(job.render(context_of(store), ViewState(), STALLED_JOB)[1])
        assert info.startswith("pretrain-7b (proj1, gpu, array 40_1) · ")
    finally:
        with store.db.write_transaction() as conn:
            conn.execute(slurmtables.job_info.delete())
    assert not text_of(job.render(context_of(store), ViewState(), STALLED_JOB)[1]).startswith("pretrain-7b")


def test_the_remediation_page_shows_the_brake_the_held_nodes_and_each_decision(empty_db: Database) -> None:
    from gpulens.dashboard.pages import remediation
    from gpulens.storage import remediationstore

    t = empty_db.clock.now()
    hold = remediationstore.NodeHold("node-07", "slurm-drain", "gpulens: fp7 gpu 3", t, True, False)
    remediationstore.hold(empty_db, hold, "fp7", "gpu 3")
    record_drain_action(
        empty_db, DrainRecord(t, "slurm-drain", "node-07", "3", "XidError:79", "drained", "gpulens: fp7")
    )
    record_drain_action(
        empty_db, DrainRecord(t + 1, "slurm-drain", "n[01-40]", "3", "XidError:79", "refused-node-name", "not one node")
    )
    context = Context(db=empty_db, clock=empty_db.clock)
    status, held, decisions, _ = remediation.render(context, ViewState())
    assert "Remediation acts." in text_of(status)
    assert "fp7" in text_of(held)
    assert text_of(decisions).index("refused-node-name") < text_of(decisions).index("drained")  # newest first
    remediationstore.halt(empty_db, t + 2, "11 of 100 nodes wanted drained")
    status = remediation.render(context, ViewState())[0]
    assert "halted by its brake" in text_of(status)
    assert "11 of 100 nodes" in text_of(status)
