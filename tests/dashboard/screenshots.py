"""Regenerate docs/screenshots: ``python -m tests.dashboard.screenshots [DIR]`` (``--fabric``: only the fabric's).

Fills a temporary database from the test scenario (a stall, a straggler, saturated GPUs, a lost GPU, an exporter
down), serves the dashboard at the scenario's end, and photographs every page with headless Debian Chromium.
"""

from __future__ import annotations

import logging
import sys
import tempfile
from pathlib import Path
from typing import Final

from playwright.sync_api import Browser, Page

from gpulens.clock import ManualClock
from gpulens.dashboard.app import create_app
from gpulens.storage.db import Database
from gpulens.storage.inventory import gpu_info
from tests.dashboard.browser import chromium, serving, wait_rendered
from tests.dashboard.cluster import STALLED_JOB, fill

WIDTH: Final = 1440


def themed_page(browser: Browser, theme: str) -> Page:
    """A page whose stored theme preference is ``theme`` (what the theme button leaves in local storage)."""
    context = browser.new_context(viewport={"width": WIDTH, "height": 900})
    context.add_init_script(f"window.localStorage.setItem('gpulens-theme', '{theme}')")
    return context.new_page()


def shoot(page: Page, url: str, path: Path) -> None:
    page.goto(url)
    wait_rendered(page)
    page.wait_for_timeout(300)  # let Plotly finish its transitions
    page.screenshot(path=str(path), full_page=True)
    print(path, file=sys.stderr)


def shoot_part(page: Page, url: str, selector: str, path: Path) -> None:
    """Only the part of the page ``selector`` names (the page's own data loaded and drawn first)."""
    page.goto(url)
    wait_rendered(page)
    page.wait_for_timeout(300)
    page.locator(selector).screenshot(path=str(path))
    print(path, file=sys.stderr)


def shoot_fabric(page: Page, base: str, out: Path) -> None:
    """The fabric views: every port and a node's topology with its ports; a job's fabric traffic and host CPU; the
    overview's fabric column."""
    shoot(page, base + "/interconnect?node=node-01", out / "interconnect-fabric.png")
    shoot_part(page, base + f"/jobs/{STALLED_JOB}", "#job-fabric", out / "job-fabric.png")
    shoot(page, base + "/", out / "overview-fabric.png")


def shoot_operator(page: Page, base: str, out: Path) -> None:
    """What an operator paged by the hang opens: an alert row opened onto its runbook, and the stalled job over the
    last 15 minutes (its heatmap cells span their samples)."""
    page.goto(base + "/alerts")
    wait_rendered(page)
    row = page.locator("#alerts-active tr", has_text="CommunicationStall")
    row.locator("summary").click()
    row.screenshot(path=str(out / "alert-detail.png"))
    print(out / "alert-detail.png", file=sys.stderr)
    shoot_part(page, base + f"/jobs/{STALLED_JOB}?range=15m", "#job-charts", out / "job-15m.png")


def main(out: Path, only_fabric: bool = False) -> int:
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        clock = ManualClock(0.0)
        db = Database(f"sqlite:///{Path(tmp) / 'gpulens.db'}", clock=clock)
        filled = fill(db)
        clock.set(filled.end)
        straggler = next(g.uuid for g in gpu_info(db) if (g.node, g.gpu) == ("node-02", 2))
        pages = {
            "incidents": "/incidents",
            "overview": "/",
            "jobs": "/jobs",
            "job": f"/jobs/{STALLED_JOB}",
            "node": "/nodes/node-02",
            "gpu": f"/gpus/{straggler}",
            "interconnect": "/interconnect?node=node-01",
            "alerts": "/alerts",
            "reports": "/reports",
        }
        with serving(create_app(db, alerts=filled.alerts)) as base, chromium() as browser:
            light = themed_page(browser, "light")
            if not only_fabric:
                for name, path in pages.items():
                    shoot(light, base + path, out / f"{name}.png")
                dark = themed_page(browser, "dark")
                shoot(dark, base + "/", out / "overview-dark.png")
                shoot(dark, base + f"/jobs/{STALLED_JOB}", out / "job-dark.png")
                shoot_operator(light, base, out)
            shoot_fabric(light, base, out)
        db.close()
    return 0


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--fabric"]
    sys.exit(main(Path(args[0]) if args else Path("docs/screenshots"), only_fabric="--fabric" in sys.argv[1:]))
