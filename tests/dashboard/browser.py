"""Driving Debian's Chromium headless through Playwright (never a downloaded browser), for tests, screenshots and the
bench; and serving a Dash app on a free port from a thread.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from dash import Dash
from playwright.sync_api import Browser, Page, sync_playwright
from werkzeug.serving import make_server

CHROMIUM: Final = Path("/usr/bin/chromium")
CHROMIUM_ARGS: Final = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
)

# True once the page's data callback has answered (the "as of" line is filled) and every chart has drawn.
RENDERED_JS: Final = """() => {
    const updated = document.querySelector('.gl-updated');
    if (!updated || !updated.textContent) return false;
    const graphs = Array.from(document.querySelectorAll('.dash-graph'));
    return graphs.every(g => g.querySelector('.main-svg') && !g.querySelector('.dash-graph--pending'));
}"""


class ChromiumMissingError(RuntimeError):
    pass


@contextmanager
def chromium() -> Iterator[Browser]:
    """Headless Debian Chromium. Raises ``ChromiumMissingError`` when /usr/bin/chromium is not installed."""
    if not CHROMIUM.exists():
        raise ChromiumMissingError(
            f"{CHROMIUM} is missing: install Debian's chromium and chromium-driver (.ci/run does); "
            "never `playwright install`"
        )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=list(CHROMIUM_ARGS))
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def serving(app: Dash) -> Iterator[str]:
    """``app`` on a free port of 127.0.0.1, served from a thread; yields the base URL (no trailing slash)."""
    server = make_server("127.0.0.1", 0, app.server, threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="dash-test-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def wait_rendered(page: Page, timeout_ms: float = 30_000) -> None:
    page.wait_for_function(RENDERED_JS, timeout=timeout_ms, polling=50)
