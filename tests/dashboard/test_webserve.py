"""``dashboard.webserve``: gzip keeps the entity tag usable, so the unfingerprinted Plotly bundle revalidates (304)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from dash import Dash
from werkzeug.test import Client

from gpulens.dashboard.app import ASSETS, PLOTLY_BUNDLE, REGENERATOR, create_app
from gpulens.dashboard.webserve import IMMUTABLE, CompressAndCache, vendored
from gpulens.storage.db import Database

PLOTLY = "/_dash-component-suites/plotly/package_data/plotly.min.js"


def _client(db: Database) -> Client:
    app: Dash = create_app(db)
    return Client(CompressAndCache(app.server.wsgi_app))


def test_gzipped_plotly_keeps_a_tag_and_revalidates_to_304(empty_db: Database) -> None:
    client = _client(empty_db)
    first = client.get(PLOTLY, headers={"Accept-Encoding": "gzip"})
    assert first.status_code == 200
    assert first.headers["Content-Encoding"] == "gzip"
    tag = first.headers["ETag"]
    assert tag.endswith('-gzip"')
    again = client.get(PLOTLY, headers={"Accept-Encoding": "gzip", "If-None-Match": tag})
    assert again.status_code == 304
    assert again.get_data() == b""


def test_compressed_body_with_a_tag_is_compressed_once() -> None:
    calls: list[int] = []

    def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        calls.append(1)
        start_response("200 OK", [("Content-Type", "text/javascript"), ("ETag", '"abc"')])
        return [b"x" * 10_000]

    wrapped = CompressAndCache(app)
    sizes = []
    for _ in range(2):
        response = Client(wrapped).get("/script.js", headers={"Accept-Encoding": "gzip"})
        sizes.append(len(response.get_data()))
        assert response.headers["ETag"] == '"abc-gzip"'
    assert sizes[0] == sizes[1] < 10_000
    assert len(wrapped._cache) == 1


def test_uncompressed_clients_get_the_original_tag(empty_db: Database) -> None:
    response = _client(empty_db).get(PLOTLY)
    assert "Content-Encoding" not in response.headers
    assert not response.headers["ETag"].endswith('-gzip"')


def test_assets_linked_with_their_modification_time_are_immutable(empty_db: Database) -> None:
    client = _client(empty_db)
    page = client.get("/").get_data(as_text=True)
    start = page.index("/assets/gpulens.css?m=")
    url = page[start : page.index('"', start)]
    assert client.get(url).headers["Cache-Control"] == IMMUTABLE
    assert client.get("/assets/gpulens.css").headers.get("Cache-Control") != IMMUTABLE


def test_vendored_files_named_with_their_version_are_immutable(empty_db: Database) -> None:
    client = _client(empty_db)
    response = client.get("/assets/" + PLOTLY_BUNDLE, headers={"Accept-Encoding": "gzip"})
    assert response.status_code == 200
    assert response.headers["Cache-Control"] == IMMUTABLE
    assert response.headers["Content-Encoding"] == "gzip"
    assert vendored("/assets/vendor/plotly-cartesian-4.1.1.min.js")
    assert not vendored("/assets/vendor/plotly-cartesian.min.js")  # no version in the name: may change
    assert not vendored("/assets/gpulens.js")


def test_the_vendored_bundle_is_not_linked_into_the_page(empty_db: Database) -> None:
    """plotlyearly.js loads it asynchronously; a blocking script tag in every page would cost what it saves."""
    client = _client(empty_db)
    page = client.get("/").get_data(as_text=True)
    assert "plotlyearly.js" in page
    assert PLOTLY_BUNDLE not in page
    assert PLOTLY_BUNDLE in (ASSETS / "plotlyearly.js").read_text()
    # regenerator-runtime replaces Dash's polyfill, before React and Dash's bundles
    scripts = re.findall(r'<script src="([^"]+)"', page)
    assert not [s for s in scripts if "polyfill" in s]
    assert scripts[0] == "/assets/" + REGENERATOR
    assert client.get(scripts[0]).status_code == 200
