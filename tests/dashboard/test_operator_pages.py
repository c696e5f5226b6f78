"""What an operator paged by the hang sees, in a real Chromium over the filled store (the stall of llm-pretrain on
node-00 and node-01 is on at 00:59; GPU node-02:7 is lost, node-01 has a narrow PCIe link and a port down)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from gpulens.dashboard.app import create_app
from gpulens.dashboard.figures.periods import PERIOD_COLORS
from gpulens.dashboard.figures.style import HEALTH_COLORS
from tests.dashboard.browser import chromium, serving
from tests.dashboard.cluster import STALLED_JOB, ReplayedAlerts
from tests.dashboard.conftest import Store
from tests.dashboard.test_browser import open_page


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as launched:
        yield launched


@pytest.fixture(scope="module")
def base_url(app_over_store: Any) -> Iterator[str]:
    with serving(app_over_store) as url:
        yield url


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    yield opened
    context.close()
    assert errors == []


def figure_of(page: Page, graph_id: str) -> dict[str, Any]:
    """What Plotly drew in the graph ``graph_id``: its data and layout."""
    return dict(
        page.evaluate(
            """(id) => { const g = document.querySelector('#' + id + ' .js-plotly-plot');
                return {data: g.data, layout: g.layout}; }""",
            graph_id,
        )
    )


def test_the_overview_names_the_stalled_job_and_marks_its_gpus_hung(page: Page, base_url: str) -> None:
    open_page(page, base_url + "/")
    banner = page.locator(".gl-banner.bad").first
    expect(banner).to_contain_text("1 job(s) stalled")
    assert banner.get_by_role("link", name=STALLED_JOB).count() == 1
    heatmap = figure_of(page, "overview-heatmap")
    nodes = heatmap["layout"]["yaxis"]["tickvals"]
    overlay = next(t for t in heatmap["data"] if t.get("name", "").startswith("down, hung"))
    hung = {node: row.count(0.5) for node, row in zip(nodes, overlay["z"], strict=True)}
    assert hung == {"node-00": 8, "node-01": 8, "node-02": 0, "node-03": 0, "node-04": 0}
    ticks = dict(zip(nodes, heatmap["layout"]["yaxis"]["ticktext"], strict=True))
    assert HEALTH_COLORS["Unhealthy"] in ticks["node-02"]  # its GPU 7 is lost
    assert HEALTH_COLORS["Degraded"] in ticks["node-01"]  # a PCIe link at x8, a port down
    assert HEALTH_COLORS["Healthy"] in ticks["node-00"]
    assert "●" not in ticks["node-04"]  # its exporter is down: its last verdict is not now's
    card = page.locator(".gl-card", has_text="Nodes healthy")
    expect(card).to_contain_text("2/4")
    expect(card).to_contain_text("1 unhealthy · 1 degr.")


def test_a_node_page_shows_its_jobs_alerts_and_their_stall(page: Page, base_url: str) -> None:
    open_page(page, base_url + "/nodes/node-00")
    alerts = page.locator("#node-alerts")
    expect(alerts.locator("tr", has_text="CommunicationStall")).to_have_count(1)  # the job's alert, not the node's
    chart = figure_of(page, "node-chart-utilization")
    fills = [s.get("fillcolor") for s in chart["layout"].get("shapes", [])]
    assert PERIOD_COLORS["stall"] in fills


def test_an_alert_row_opens_its_runbook_and_says_when_the_fault_began(page: Page, base_url: str) -> None:
    open_page(page, base_url + "/alerts")
    row = page.locator("#alerts-active tr", has_text="CommunicationStall")
    cells = row.locator("td")
    assert cells.nth(5).inner_text() == "2026-01-01 00:40 UTC"  # began: when the hang started
    assert cells.nth(6).inner_text().startswith("2026-01-01 00:45 UTC")  # fired: after its 5 minutes
    runbook = row.locator(".gl-runbook")
    expect(runbook).to_be_hidden()
    row.locator("summary").click()
    expect(runbook).to_be_visible()
    expect(runbook).to_contain_text("Runbook:")


def test_a_stall_that_ended_still_flags_its_job_over_the_range(page: Page, store: Store) -> None:
    """A minute after the stall resolved, the jobs list still flags the job for the range, as ended."""
    alerts = store.filled.alerts
    ended = [
        replace(s, state="resolved", resolved_at=store.filled.end - 60) if s.rule == "CommunicationStall" else s
        for s in alerts.episodes
    ]
    resolved = ReplayedAlerts(
        [s for s in alerts.states if s.rule != "CommunicationStall"], ended, list(alerts.silenced)
    )
    with serving(create_app(store.db, alerts=resolved)) as url:
        open_page(page, url + "/jobs?flag=stalled")
        rows = page.locator("#jobs-table-rows tbody tr")
        expect(rows).to_have_count(1)
        assert rows.first.locator(".gl-flag").all_inner_texts() == ["stalled (ended)"]
