"""The exporter's HTTP endpoints: /metrics, /api/v1/snapshot and /healthz, for one node or for many.

Every response is pre-rendered by the poller; a request only picks bytes, so a scrape never touches NVML. The
server (``gpulens.httpserver``: the worker pool, keep-alive, TLS and basic auth from ``--web-config``) is the one
every gpulens endpoint uses; ``exporter_server`` gives it the exporter's routes, its ``Server`` header and
``Cache-Control: no-store`` on every answer.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any, Final
from urllib.parse import parse_qs, unquote

from gpulens.connections import DEFAULT_IDLE_TIMEOUT_S, DEFAULT_WORKERS
from gpulens.exporter.poller import NodeEndpoint, Published
from gpulens.httpserver import HttpServer, Request, Response
from gpulens.model import LINK_SCOPES, LINKS_ALL
from gpulens.snapshotcodec import LAYOUT_ROWS, LAYOUTS
from gpulens.webconfig import WebConfig

METRICS_CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
JSON_CONTENT_TYPE: Final = "application/json"
HTML_CONTENT_TYPE: Final = "text/html; charset=utf-8"
GZIP: Final = {"Content-Encoding": "gzip"}


class Routes:
    """Which endpoints answer: one node at the root, or many under ``/node/<name>/``."""

    def __init__(self, single: NodeEndpoint | None = None, nodes: Mapping[str, NodeEndpoint] | None = None) -> None:
        if (single is None) == (nodes is None):
            raise ValueError("give exactly one of single or nodes")
        self.single = single
        self.nodes = dict(nodes or {})

    def __call__(self, request: Request) -> Response:
        path = unquote(request.path).rstrip("/") or "/"
        if self.single is not None:
            return _node_path(self.single, path, request)
        if path == "/":
            return _index(sorted(self.nodes))
        if path == "/api/v1/nodes":
            return _json(HTTPStatus.OK, sorted(self.nodes))
        if path == "/healthz":
            return _json(HTTPStatus.OK, {"status": "ok", "nodes": len(self.nodes)})
        if path.startswith("/node/"):
            name, _, rest = path[len("/node/") :].partition("/")
            endpoint = self.nodes.get(name)
            if endpoint is None:
                return _json(HTTPStatus.NOT_FOUND, {"error": f"unknown node {name!r}"})
            return _node_path(endpoint, "/" + rest if rest else "/", request)
        return _json(HTTPStatus.NOT_FOUND, {"error": "not found; see /node/<name>/metrics", "path": path})


def exporter_server(
    routes: Routes,
    *,
    host: str = "0.0.0.0",
    port: int = 9410,
    web: WebConfig | None = None,
    workers: int = DEFAULT_WORKERS,
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
) -> HttpServer:
    """The exporter's endpoints on ``host:port``, not yet started."""
    return HttpServer(
        routes,
        host=host,
        port=port,
        web=web,
        name="gpulens-http",
        version="gpulens-exporter",
        cache_control="no-store",
        workers=workers,
        idle_timeout_s=idle_timeout_s,
    )


def _json(status: int, doc: Any) -> Response:
    return Response(status, json.dumps(doc, separators=(",", ":")).encode(), JSON_CONTENT_TYPE)


def _gzip_accepted(request: Request) -> bool:
    return "gzip" in request.headers.get("Accept-Encoding", "")


def _node_path(endpoint: NodeEndpoint, path: str, request: Request) -> Response:
    if path == "/":
        return _index(None)
    if path not in ("/metrics", "/api/v1/snapshot", "/healthz"):
        return _json(HTTPStatus.NOT_FOUND, {"error": "not found", "path": path})
    published = endpoint.published()
    if published.unavailable:
        return _json(HTTPStatus.SERVICE_UNAVAILABLE, {"status": "unavailable", **published.health_doc})
    if path == "/metrics":
        if _gzip_accepted(request):
            return Response(HTTPStatus.OK, published.metrics_gzip, METRICS_CONTENT_TYPE, GZIP)
        return Response(HTTPStatus.OK, published.metrics, METRICS_CONTENT_TYPE)
    if path == "/api/v1/snapshot":
        if published.snapshot is None:
            # No current snapshot (collection failing or stale): say so rather than serve old data as new.
            return _json(HTTPStatus.SERVICE_UNAVAILABLE, {"status": "unhealthy", **published.health_doc})
        return _snapshot(published, request)
    if published.healthy:
        return _json(HTTPStatus.OK, {"status": "ok", **published.health_doc})
    return _json(HTTPStatus.SERVICE_UNAVAILABLE, {"status": "unhealthy", **published.health_doc})


def _snapshot(published: Published, request: Request) -> Response:
    """The snapshot in the layout the client asked for (``?layout=columnar``; docs/snapshot.md), rows by default,
    with every link or only the inactive ones (``?links=inactive``, what the collector asks for)."""
    query = parse_qs(request.query)
    [layout] = query.get("layout", [LAYOUT_ROWS])[-1:]
    [links] = query.get("links", [LINKS_ALL])[-1:]
    if layout not in LAYOUTS:
        return _json(HTTPStatus.BAD_REQUEST, {"error": f"unknown layout {layout[:40]!r}; use one of {list(LAYOUTS)}"})
    if links not in LINK_SCOPES:
        return _json(HTTPStatus.BAD_REQUEST, {"error": f"unknown links {links[:40]!r}; use one of {list(LINK_SCOPES)}"})
    if _gzip_accepted(request):
        body = published.snapshot_body(layout, gzipped=True, links=links)
        return Response(HTTPStatus.OK, body, JSON_CONTENT_TYPE, GZIP)
    return Response(HTTPStatus.OK, published.snapshot_body(layout, gzipped=False, links=links), JSON_CONTENT_TYPE)


def _index(nodes: list[str] | None) -> Response:
    if nodes is None:
        links = '<a href="metrics">metrics</a> · <a href="api/v1/snapshot">snapshot</a> · <a href="healthz">healthz</a>'
    else:
        links = "<br>".join(
            f'<a href="/node/{h}/metrics">{h}</a> (<a href="/node/{h}/api/v1/snapshot">snapshot</a>)'
            for h in map(html.escape, nodes)
        )
    body = f"<!doctype html><title>gpulens exporter</title><h1>gpulens exporter</h1><p>{links}</p>\n"
    return Response(HTTPStatus.OK, body.encode(), HTML_CONTENT_TYPE)
