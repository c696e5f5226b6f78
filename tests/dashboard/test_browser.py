"""The dashboard in a real headless Chromium (Debian's, through Playwright) over the filled test database.

Every test fails on any console error or uncaught page error. A missing /usr/bin/chromium fails the tests loudly.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from playwright.sync_api import Browser, Page, expect

from gpulens.clock import ManualClock
from gpulens.dashboard.app import PLOTLY_BUNDLE, create_app
from gpulens.storage.db import Database
from tests.conftest import free_port
from tests.dashboard.browser import ChromiumMissingError, chromium, serving, wait_rendered
from tests.dashboard.cluster import STALLED_JOB
from tests.dashboard.conftest import Store
from tests.dbtemplate import migrated_sqlite


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    try:
        with chromium() as launched:
            yield launched
    except ChromiumMissingError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="module")
def base_url(app_over_store: Any) -> Iterator[str]:
    with serving(app_over_store) as url:
        yield url


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    opened = context.new_page()
    errors: list[str] = []
    opened.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    opened.on("pageerror", lambda error: errors.append(str(error)))
    yield opened
    context.close()
    assert errors == [], "console errors in the browser"


def gpu_uuid(store: Store, node: str, index: int) -> str:
    from gpulens.storage.inventory import gpu_info

    return next(g.uuid for g in gpu_info(store.db) if (g.node, g.gpu) == (node, index))


def open_page(page: Page, url: str) -> None:
    page.goto(url)
    wait_rendered(page)


def arrive(page: Page, heading: str) -> None:
    """Wait for an in-app navigation to land on the page titled ``heading`` and for its charts to draw."""
    expect(page.locator("h1")).to_have_text(heading)
    wait_rendered(page)


def charts(page: Page) -> int:
    """Charts that Plotly has drawn (an SVG with a plot or a message in it)."""
    return int(
        page.evaluate(
            """() => Array.from(document.querySelectorAll('.dash-graph')).filter(g =>
                g.querySelector('.main-svg') && g.querySelector('.cartesianlayer, .infolayer .annotation')).length"""
        )
    )


def query_of(page: Page) -> dict[str, list[str]]:
    return parse_qs(urlsplit(page.url).query)


PAGES = {
    "overview": ("/", 1),
    "jobs": ("/jobs", 1),
    "job": (f"/jobs/{STALLED_JOB}", 3),
    "node": ("/nodes/node-02", 10),
    "interconnect": ("/interconnect", 3),
    "alerts": ("/alerts", 0),
    "remediation": ("/remediation", 0),
    "reports": ("/reports", 1),
}


@pytest.mark.parametrize("name", PAGES)
def test_every_page_renders(page: Page, base_url: str, name: str) -> None:
    path, expected_charts = PAGES[name]
    open_page(page, base_url + path)
    assert charts(page) >= expected_charts
    assert page.locator(".gl-updated").inner_text().startswith("as of 2026-01-01 00:59 UTC")


def test_gpu_page_renders(page: Page, base_url: str, store: Store) -> None:
    open_page(page, f"{base_url}/gpus/{gpu_uuid(store, 'node-02', 2)}")
    assert page.locator("h1").inner_text() == "GPU node-02:2"
    assert charts(page) == 10


def test_the_stalled_job_is_flagged_on_the_jobs_page(page: Page, base_url: str) -> None:
    open_page(page, base_url + "/jobs")
    row = page.locator("#jobs-table-rows tr", has=page.get_by_role("link", name=STALLED_JOB, exact=True))
    assert row.locator(".gl-flag").all_inner_texts() == ["stalled"]
    assert "flagged" in (row.get_attribute("class") or "")


def test_the_stall_alert_is_on_the_alerts_page_and_links_to_its_job(page: Page, base_url: str) -> None:
    open_page(page, base_url + "/alerts")
    row = page.locator("#alerts-active tr", has_text="CommunicationStall")
    assert row.locator(".gl-flag").first.inner_text() == "firing"
    row.get_by_role("link", name=STALLED_JOB).click()
    arrive(page, f"Job {STALLED_JOB}")
    assert page.locator(".gl-banner.bad").inner_text().startswith("The alert engine flags this job.")


def test_links_lead_from_page_to_page(page: Page, base_url: str) -> None:
    open_page(page, base_url + "/jobs")
    page.get_by_role("link", name=STALLED_JOB, exact=True).click()
    arrive(page, f"Job {STALLED_JOB}")
    page.locator("#job-gpus").get_by_role("link", name="node-01:6").click()
    arrive(page, "GPU node-01:6")
    assert re.search(r"/gpus/GPU-[0-9a-f-]+\?range=1h", page.url)
    page.locator("#gpu-info").get_by_role("link", name="node-01").click()
    arrive(page, "Node node-01")
    page.locator(".gl-nav").get_by_role("link", name="Interconnect").click()
    arrive(page, "Interconnect")


def test_a_heatmap_cell_opens_its_gpu(page: Page, base_url: str) -> None:
    open_page(page, base_url + "/")
    # the open incidents sit above the heatmap and push it below the fold: bring it into view before clicking
    page.locator("#overview-heatmap").scroll_into_view_if_needed()
    plot = page.locator("#overview-heatmap .nsewdrag").first.bounding_box()
    assert plot is not None
    # Five node rows, eight GPU columns: the middle of node-01's GPU 3.
    page.mouse.click(plot["x"] + plot["width"] * 3.5 / 8, plot["y"] + plot["height"] * 1.5 / 5)
    arrive(page, "GPU node-01:3")
    assert query_of(page)["range"] == ["1h"]  # the range came along


def test_the_url_carries_the_page_state(page: Page, base_url: str) -> None:
    open_page(page, base_url + "/")
    page.locator("#overview-range label", has_text="6h").click()
    page.locator("#overview-metric label", has_text="Temperature").click()
    page.wait_for_function("() => location.search.includes('metric=temperature')")
    assert query_of(page)["range"] == ["6h"]
    page.reload()
    wait_rendered(page)
    assert page.locator("#overview-range input:checked").get_attribute("value") == "6h"
    assert page.locator("#overview-metric input:checked").get_attribute("value") == "temperature"
    assert page.locator(".gl-updated").inner_text().endswith("last 6h")
    assert page.locator("#overview-heatmap .cbtitle").text_content() == "Temperature"


def test_a_custom_range(page: Page, base_url: str) -> None:
    open_page(page, f"{base_url}/nodes/node-00?range=custom&from=2026-01-01T00:30&to=2026-01-01T00:40")
    assert page.locator("#node-from").input_value() == "2026-01-01T00:30"
    assert page.locator(".gl-updated").inner_text().endswith("2026-01-01 00:30 UTC to 2026-01-01 00:40 UTC")


def test_the_theme_switches_and_sticks(page: Page, base_url: str) -> None:
    open_page(page, base_url + "/alerts")
    before = page.evaluate("document.documentElement.dataset.theme")
    page.locator("#shell-theme-toggle").click()
    # The switch is a client-side callback: wait for it rather than read the attribute in the same instant.
    page.wait_for_function(f"document.documentElement.dataset.theme !== {before!r}", timeout=15_000)
    after = page.evaluate("document.documentElement.dataset.theme")
    assert {before, after} == {"light", "dark"}
    page.reload()
    wait_rendered(page)
    assert page.evaluate("document.documentElement.dataset.theme") == after


@pytest.mark.parametrize("broken", ["empty", "unreachable"])
def test_empty_and_unreachable_databases_are_said_plainly(
    page: Page, browser: Browser, tmp_path: Path, broken: str
) -> None:
    if broken == "empty":
        db = Database(migrated_sqlite(tmp_path / "empty.db"), clock=ManualClock(1_767_225_600.0))
        expected = {"/": "No data yet.", "/jobs": "No data yet.", "/nodes/node-00": "No GPU of node 'node-00'"}
    else:
        db = Database(f"postgresql+psycopg://gpulens:pw@127.0.0.1:{free_port()}/gpulens", clock=ManualClock(0.0))
        expected = dict.fromkeys(("/", "/jobs", "/nodes/node-00", "/interconnect"), "Database unreachable.")
    try:
        with serving(create_app(db)) as url:
            for path, message in expected.items():
                open_page(page, url + path)
                assert page.locator(".gl-banner").first.inner_text().startswith(message), path
    finally:
        db.close()


def test_auto_refresh_reads_the_data_again(page: Page, base_url: str) -> None:
    open_page(page, base_url + "/alerts?refresh=10s")
    with page.expect_request(lambda request: "_dash-update-component" in request.url, timeout=20_000) as asked:
        pass  # the 10 s interval fires on its own
    assert "alerts-active" in (asked.value.post_data or "")
    page.locator("#alerts-refresh").click()
    page.get_by_role("option", name="off").click()
    page.wait_for_function("() => location.search.includes('refresh=off')")


# --- the fabric -----------------------------------------------------------------------------------------------------


def test_the_interconnect_shows_every_port_and_the_nodes_topology_with_its_ports(page: Page, base_url: str) -> None:
    open_page(page, base_url + "/interconnect?node=node-01")
    rows = page.locator("#ic-fabric-table tbody tr")
    expect(rows).to_have_count(33)
    first = rows.first.locator("td")
    assert first.nth(0).inner_text() == "node-01"
    assert first.nth(1).inner_text() == "mlx5_3/1"
    assert first.nth(3).inner_text() == "down"
    assert "flagged" in (rows.first.get_attribute("class") or "")
    assert rows.nth(1).locator(".gl-flag.degraded").inner_text() == "degraded: 2X of 4X"
    saturated = page.locator("#ic-fabric-table tr", has_text="mlx5_5/1").filter(has_text="node-02")
    assert saturated.locator(".gl-bar.warn .gl-bar-text").first.inner_text() == "93%"  # amber: red is for down
    # Each label drawn in the topology, as its lines: ["mlx5_3", "down"], ["GPU 0", "Gen5 x16"], ...
    labels = page.evaluate(
        """() => Array.from(document.querySelectorAll('#ic-topology .scatterlayer text')).map(t =>
            Array.from(t.querySelectorAll('tspan.line')).map(line => line.textContent))"""
    )
    ports = {lines[0]: lines[1] for lines in labels if lines and lines[0].startswith("mlx5_")}
    assert set(ports) == {f"mlx5_{i}" for i in range(8)}
    assert ports["mlx5_3"] == "down"
    assert ports["mlx5_0"] == "0% idle"  # the stalled job moves nothing now: idle, not healthy
    assert page.locator("#ic-topology-note").inner_text().startswith("node-01: 7 of 8 RDMA ports up")
    # A node in the table opens its topology.
    page.locator("#ic-fabric-table").get_by_role("link", name="node-02").first.click()
    page.wait_for_function("() => location.search.includes('node=node-02')")
    wait_rendered(page)
    expect(page.locator("#ic-topology-note")).to_contain_text("node-02: 9 of 9 RDMA ports up")


def test_a_node_without_ports_says_so_in_the_browser(page: Page, base_url: str) -> None:
    open_page(page, base_url + "/interconnect?node=node-03")
    expect(page.locator("#ic-topology-note")).to_have_text("node-03: no fabric data (the exporter reads no RDMA ports)")


def test_the_job_page_shows_its_fabric_traffic_and_host_cpu(page: Page, base_url: str) -> None:
    open_page(page, f"{base_url}/jobs/{STALLED_JOB}")
    fabric = page.locator("#job-chart-fabric")
    assert sorted(fabric.locator(".ytick text").all_text_contents()) == ["node-00 (8 NICs)", "node-01 (8 NICs)"]
    assert fabric.locator(".cbtitle").text_content() == "Fabric (of the ports' rate)"
    cpu = page.locator("#job-chart-host-cpu")
    assert cpu.locator(".legendtext").all_text_contents() == ["node-00", "node-01", "limit 64 cores"]
    expect(page.locator("#job-fabric")).to_contain_text("down now: node-01 mlx5_3")


def test_the_overview_has_a_fabric_column(page: Page, base_url: str) -> None:
    open_page(page, base_url + "/")
    rows = page.locator("#overview-fabric-table tbody tr")
    expect(rows).to_have_count(5)
    cells = [rows.nth(i).locator("td").nth(1).inner_text() for i in range(5)]
    assert cells == ["8/8", "7/8", "9/9", "no RDMA ports read", "8/8"]
    assert rows.nth(0).locator(".gl-flag.down").inner_text() == "errors"
    assert rows.nth(4).locator(".gl-flag.stale").last.inner_text() == "stale: no recent reading"
    card = page.locator(".gl-card", has_text="Fabric ports up")
    assert card.locator(".gl-card-value").inner_text() == "24/25"


_CHART_SIZES = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd =>
    [gd.getBoundingClientRect().width, gd._fullLayout.width])"""


def test_charts_fit_their_boxes_and_follow_a_resized_window(page: Page, base_url: str) -> None:
    """The partial Plotly bundle draws the page, and skipping Plotly.Plots.resize for a chart that fits its box
    already (assets/plotlyearly.js) still lets charts follow their boxes when the window changes size."""
    open_page(page, base_url + "/nodes/node-02")
    loaded = page.evaluate("() => performance.getEntriesByType('resource').map(e => e.name)")
    assert [name for name in loaded if name.endswith(PLOTLY_BUNDLE)]
    assert not [name for name in loaded if name.endswith("/plotly.min.js")]
    before = page.evaluate(_CHART_SIZES)
    assert len(before) == 10
    assert all(abs(box - drawn) <= 1 for box, drawn in before), before
    page.set_viewport_size({"width": 800, "height": 1000})
    page.wait_for_function(
        f"() => ({_CHART_SIZES})().every(([box, drawn]) => Math.abs(box - drawn) <= 1)", timeout=10_000
    )
    after = page.evaluate(_CHART_SIZES)  # one column at this width: wider boxes than the two columns' before
    assert all(now != then for (now, _), (then, _) in zip(after, before, strict=True)), (before, after)


def test_the_reports_page_lists_each_users_gpu_hours_and_idle_share(page: Page, base_url: str, store: Store) -> None:
    from gpulens.settings import Prices
    from gpulens.storage import usagereport

    now = store.clock.now()
    expected = usagereport.usage(store.db, "user", now - 3600, now, Prices())  # the page's default range: 1h
    assert {r.group for r in expected} >= {"alice", "bob", "carol"}
    open_page(page, base_url + "/reports")
    assert charts(page) == 1
    shown = {
        cells[0]: cells
        for cells in (row.locator("td").all_inner_texts() for row in page.locator("#reports-table-rows tbody tr").all())
    }
    assert set(shown) == {r.group for r in expected}
    for r in expected:
        assert shown[r.group][2] == f"{r.gpu_hours:.2f}"
        assert shown[r.group][4] == ("\u2013" if r.idle_ratio is None else f"{r.idle_ratio * 100:.0f}%")
    assert page.locator("#reports-idle-trend .scatterlayer .trace").count() == 1 + min(6, len(expected))
    page.locator("#reports-by").get_by_text("by partition").click()
    expect(page.locator("#reports-table-rows th").first).to_have_text("partition")
    assert "by=partition" in page.url
