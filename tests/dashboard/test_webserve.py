"""``dashboard.webserve``: gzip keeps the entity tag usable, so the unfingerprinted Plotly bundle revalidates (304)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dash import Dash
from werkzeug.test import Client

from dashboard.app import create_app
from dashboard.webserve import IMMUTABLE, CompressAndCache
from storage.db import Database

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
