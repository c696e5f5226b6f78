"""The pages' callback payloads stay within a byte bound on a fixed store (bytes sent, not time taken).

A store of 40 nodes x 8 GPUs over 1.5 hours, one job stalled (its GPUs drawn hung over their values), is rendered by
each page's server callback and encoded as Dash encodes it. The bounds sit a little above today's sizes: a trace that
repeats every cell's hover text, or a table that sends what it does not show, goes over them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from plotly.io.json import to_json_plotly

from bench.bench_dashboard import END, Cluster, build, stall_alert, timeline
from gpulens.clock import ManualClock
from gpulens.dashboard.components import ViewState
from gpulens.dashboard.context import Context
from gpulens.dashboard.figures.grids import cluster_map
from gpulens.dashboard.heatmaps import METRICS
from gpulens.dashboard.pages import jobs, node, overview
from gpulens.storage.db import Database
from gpulens.storage.rollup import Rollups
from tests.dbtemplate import migrated_sqlite

NODES = 40
OVERLAY = "down, hung or stale"


@pytest.fixture(scope="module")
def context(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Context]:
    path: Path = tmp_path_factory.mktemp("payload") / "gpulens.db"
    db = Database(migrated_sqlite(path), clock=ManualClock(END))
    cluster = Cluster(NODES, 8)
    build(db, cluster, timeline(1.5, 60, 0.25, 10))
    Rollups(db, settle_s=0).run(END)
    yield Context(db=db, clock=ManualClock(END), alerts=stall_alert(cluster))
    db.close()


# page -> (its callback, the most bytes its outputs may encode to)
PAGES: dict[str, tuple[Callable[[Context], Any], int]] = {
    # was 185,656 bytes: the hung overlays (heatmap, cluster map) repeated every cell's hover text and link
    "overview": (lambda c: overview.render(c, ViewState(range="1h"), "utilization", "name", "", 1), 118_000),
    # was 99,514: each table cell sent ``className: null``
    "jobs": (lambda c: jobs.render(c, ViewState(range="1h"), "all", "", 1), 98_500),
    # was 152,227: each line sent its evenly spaced times one by one
    "node": (lambda c: node.render(c, ViewState(range="1h"), "node-0001"), 115_000),
}


@pytest.mark.parametrize("page", sorted(PAGES))
def test_page_payload_is_bounded(context: Context, page: str) -> None:
    render, bound = PAGES[page]
    size = len(to_json_plotly(render(context)))
    assert size <= bound, f"{page}: {size} bytes"


def test_overlay_carries_hover_only_for_its_cells(context: Context) -> None:
    """The hung overlay's hover texts and links are those of its own cells; its gaps have none."""
    outputs = json.loads(to_json_plotly(overview.render(context, ViewState(range="1h"), "utilization", "name", "", 1)))
    grids = [f["data"] for f in outputs if isinstance(f, dict) and f.get("data", [{}])[-1].get("name") == OVERLAY]
    assert grids, "no GPU heatmap with an overlay"
    base, overlay = grids[0]
    assert overlay["hoverongaps"] is False
    covered = 0
    for zrow, hover, path, base_hover, base_path in zip(
        overlay["z"], overlay["customdata"], overlay["hovertext"], base["customdata"], base["hovertext"], strict=True
    ):
        for z, h, p, bh, bp in zip(zrow, hover, path, base_hover, base_path, strict=True):
            assert (h, p) == ((None, None) if z is None else (bh, bp))
            covered += z is not None
    assert covered > 0


def test_cluster_map_hung_overlay_carries_hover_only_for_hung_nodes() -> None:
    nodes = [(f"n{i}", 0.5, f"node n{i}") for i in range(4)]
    under, hung = json.loads(to_json_plotly(cluster_map(nodes, METRICS["utilization"], columns=2, hung={"n2"})))["data"]
    assert under["customdata"] == [["node n0", "node n1"], ["node n2", "node n3"]]
    assert hung["customdata"] == [[None, None], ["node n2", None]]
    assert hung["hoverongaps"] is False
