"""The overview's cluster map (shown past one page of nodes) marks a stalled job's nodes hung, as its heatmap marks the
GPUs, in a real Chromium over a SQLite store of 40 nodes: their GPUs read busy, the map says hung."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from playwright.sync_api import Page

from gpulens.alerts.state import FIRING, AlertState, fingerprint
from gpulens.clock import ManualClock
from gpulens.dashboard.app import create_app
from gpulens.dashboard.figures.style import HUNG_COLOR
from gpulens.dashboard.pages.overview import MAP_COLUMNS
from gpulens.model import GpuJob
from gpulens.storage.db import Database
from gpulens.storage.writer import Writer
from tests.dashboard.browser import chromium, serving
from tests.dashboard.cluster import ReplayedAlerts
from tests.dashboard.test_browser import open_page
from tests.dbtemplate import migrated_sqlite
from tests.fakes.static_source import node_snapshot

T0 = 1_767_225_600.0
NODES = [f"node-{i:02d}" for i in range(40)]
STALLED = ("node-03", "node-37")  # the stalled job's nodes: one on the first page of the heatmap, one past it


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    clock = ManualClock(T0 + 10)
    db = Database(migrated_sqlite(tmp_path_factory.mktemp("map") / "gpulens.db"), clock=clock)
    snapshots = []
    for node in NODES:
        snap = node_snapshot(node, gpus=8, t=T0)
        job = "stuck" if node in STALLED else f"train-{node}"
        snapshots.append(replace(snap, jobs=tuple(GpuJob(node, g.gpu, g.uuid, job, "alice") for g in snap.gpus)))
    Writer(db).write(snapshots)
    labels = {"alertname": "CommunicationStall", "severity": "critical", "job_id": "stuck", "signature": "spinning"}
    stall = AlertState(fingerprint(labels), "CommunicationStall", labels, {}, FIRING, T0, fired_at=T0, last_seen=T0)
    app = create_app(db, clock=clock, alerts=ReplayedAlerts(states=[stall]))
    try:
        with serving(app) as url:
            yield url
    finally:
        db.close()


@pytest.fixture
def page() -> Iterator[Page]:
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        opened = context.new_page()
        errors: list[str] = []
        opened.on("pageerror", lambda error: errors.append(str(error)))
        yield opened
        context.close()
        assert errors == []


def test_the_cluster_map_marks_the_stalled_jobs_nodes_hung(page: Page, base_url: str) -> None:
    open_page(page, base_url + "/")
    drawn: dict[str, Any] = page.evaluate(
        """() => { const g = document.querySelector('#overview-map .js-plotly-plot');
            return {data: g.data}; }"""
    )
    values, overlay = drawn["data"]
    assert overlay["name"] == "hung"
    assert {c for _, c in overlay["colorscale"]} == {HUNG_COLOR}
    marked = [
        NODES[r * MAP_COLUMNS + c] for r, row in enumerate(overlay["z"]) for c, v in enumerate(row) if v is not None
    ]
    assert marked == list(STALLED)
    position = divmod(NODES.index("node-37"), MAP_COLUMNS)
    assert values["z"][position[0]][position[1]] > 0.9  # it reads busy: only the mark says hung
    assert "8 GPU(s) hung: job stuck stalled" in overlay["customdata"][position[0]][position[1]]
    # and Chromium drew the orange: one filled cell per hung node in the map's second layer
    fills = page.evaluate("""() => Array.from(document.querySelectorAll('#overview-map .hm image')).length""")
    assert fills == 2  # the values' layer and the hung layer
