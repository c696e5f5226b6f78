"""What a store cannot serve is said in one line, not shown as nothing: each page part that once asked which class its
reader was (the job page's scheduler line, accounting and NCCL panel, the alerts page's drain actions, the page
snapshot) now calls the read, here over a real Prometheus, and over the SQL store still shows its data.

The Prometheus history is ten minutes of two gpulens exporter nodes (``tests.storage.promblocks``), written as TSDB
blocks, with what Slurm says of one job (``gpulens_job_info``).
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
from dash.development.base_component import Component

from gpulens.clock import ManualClock
from gpulens.dashboard import snapshot
from gpulens.dashboard.components import ViewState
from gpulens.dashboard.context import Context
from gpulens.dashboard.ncclview import nccl_panel, read_nccl
from gpulens.dashboard.pages import alerts, job
from gpulens.settings import StoreAuth
from gpulens.storage.db import Database
from gpulens.storage.prometheus import PromReader
from gpulens.storage.reading import NotAvailableOnBackend
from tests.dashboard.cluster import STALLED_JOB
from tests.dashboard.conftest import Store
from tests.dashboard.test_pages import context_of, text_of
from tests.prom import running_prometheus
from tests.storage.promblocks import blocks_from_openmetrics, layout, write_openmetrics

T0: Final = 1_767_225_600  # 2026-01-01T00:00Z
STEP: Final = 10
SAMPLES: Final = 60
JOB: Final = "job-0"  # node-0000's job all along (promblocks.layout)
SCHEDULER: Final = 'job_id="job-0",name="pretrain-7b",user="user-0",account="proj1",partition="gpu"'


def _notices(value: Any) -> list[str]:
    """The text of every not-available line in a page's output."""
    if isinstance(value, Component):
        props = value.to_plotly_json()["props"]
        own = [text_of(props.get("children"))] if "gl-not-available" in str(props.get("className", "")) else []
        return own + _notices(props.get("children"))
    if isinstance(value, list | tuple):
        return [n for v in value for n in _notices(v)]
    return []


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory, prometheus_bin: str, promtool: str) -> Iterator[Context]:
    work = tmp_path_factory.mktemp("notavailable")
    text = io.StringIO()
    write_openmetrics(text, layout(2, SAMPLES), T0, STEP, SAMPLES)
    history = text.getvalue().removesuffix("# EOF\n")
    scrape = 'instance="node-0000:9410",job="gpulens"'
    history += "".join(f"gpulens_job_info{{{SCHEDULER},{scrape}}} 1 {T0 + k * STEP}\n" for k in range(SAMPLES))
    source = work / "history.om"
    source.write_text(history + "# EOF\n")
    blocks_from_openmetrics(promtool, source, work / "tsdb")
    flags = ("--storage.tsdb.retention.time=100y", "--query.lookback-delta=1m")
    with running_prometheus(prometheus_bin, Path(work), {}, flags=flags) as base:
        clock = ManualClock(T0 + STEP * SAMPLES)
        reader = PromReader("prometheus+" + base, StoreAuth(min_step_s=STEP), clock=clock)
        yield Context(db=reader, clock=clock)
        reader.close()


def test_the_job_page_over_prometheus_says_in_one_line_what_it_cannot_tell(prometheus: Context) -> None:
    status, info, charts, gpus, _alerts, fabric, _updated = job.render(prometheus, ViewState(range="1h"), JOB)
    assert status is None or "Could not read" not in text_of(status)
    assert text_of(info).startswith("pretrain-7b (proj1, gpu) · ")  # what Slurm says of it: gpulens_job_info
    assert "user-0 · 8 GPUs on 1 node(s)" in text_of(info)
    assert "Accounting" not in text_of(info)
    notices = _notices([status, info, charts, gpus, fabric])
    assert notices == ["Not available on Prometheus: Job accounting, NCCL communicator history"]


def test_the_nccl_panel_over_prometheus_is_left_to_the_page_line(prometheus: Context) -> None:
    found = read_nccl(prometheus.store, JOB, T0, T0 + 600)
    assert isinstance(found, NotAvailableOnBackend)
    assert str(found) == "NCCL communicator history: not available on Prometheus"
    assert nccl_panel(found) is None


def test_the_alerts_page_over_prometheus_says_it_keeps_no_drain_actions(prometheus: Context) -> None:
    status, _now, _history, _silences, drains, _updated = alerts.render(prometheus, ViewState())
    assert "No alert store connected" in text_of(status)
    assert _notices([drains]) == [
        "Drain actions: not available on Prometheus (they are kept in the alert engine's SQL store)"
    ]


def test_the_remediation_page_over_prometheus_says_the_store_keeps_none(prometheus: Context) -> None:
    from gpulens.dashboard.pages import remediation

    status, held, decisions, _updated = remediation.render(prometheus, ViewState())
    assert _notices([status]) == ["Not available on Prometheus: Remediation, Drain actions"]
    assert (held, decisions) == (None, None)


def test_a_page_view_over_prometheus_reads_the_reader_itself(prometheus: Context) -> None:
    with snapshot.pinned(prometheus.base) as reader:
        assert reader is prometheus.base
        assert prometheus.store is reader
    assert snapshot.current() is None


def test_the_sql_store_shows_what_prometheus_cannot(store: Store, empty_db: Database) -> None:
    outputs = job.render(context_of(store), ViewState(), STALLED_JOB)
    assert _notices(list(outputs)) == []
    assert "not available" not in text_of(list(outputs))
    drains = alerts.render(Context(db=empty_db, clock=empty_db.clock), ViewState())[4]
    assert _notices([drains]) == []
    assert "not available" not in text_of(drains)
