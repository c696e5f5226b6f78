"""The exporter's HTTP endpoints: /metrics, /api/v1/snapshot and /healthz, for one node or for many.

Every response is pre-rendered by the poller; a request only picks bytes and writes them, so a scrape never touches
NVML. TLS and basic auth come from a ``--web-config`` file (exporter-toolkit format). Connections are served by a
fixed pool of threads (``gpulens.exporter.connections``): idle keep-alive sockets hold no thread.
"""

from __future__ import annotations

import contextlib
import html
import json
import logging
import socket
import ssl
import threading
from collections.abc import Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, Final
from urllib.parse import parse_qs, unquote, urlsplit

from gpulens.exporter.connections import DEFAULT_IDLE_TIMEOUT_S, DEFAULT_WORKERS, Connection, ConnectionPool
from gpulens.exporter.poller import NodeEndpoint, Published
from gpulens.model import LINK_SCOPES, LINKS_ALL
from gpulens.snapshotcodec import LAYOUT_ROWS, LAYOUTS
from gpulens.webconfig import CHALLENGE, WebConfig

log = logging.getLogger(__name__)

METRICS_CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
JSON_CONTENT_TYPE: Final = "application/json"


class Routes:
    """Which endpoints answer: one node at the root, or many under ``/node/<name>/``."""

    def __init__(self, single: NodeEndpoint | None = None, nodes: Mapping[str, NodeEndpoint] | None = None) -> None:
        if (single is None) == (nodes is None):
            raise ValueError("give exactly one of single or nodes")
        self.single = single
        self.nodes = dict(nodes or {})


class _Server(HTTPServer):
    """Accepts connections and hands them to a ``ConnectionPool``: a fixed number of threads, however many sockets."""

    allow_reuse_address = True
    request_queue_size = 128

    def __init__(
        self, address: tuple[str, int], routes: Routes, web: WebConfig, *, workers: int, idle_timeout_s: float
    ) -> None:
        self.routes = routes
        self.web = web
        self.tls_context = web.tls.context() if web.tls else None
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.address_family = family
        super().__init__(address, _Handler)
        self.pool = ConnectionPool(
            self._serve_one, self._close_connection, workers=workers, idle_timeout_s=idle_timeout_s
        )

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = super().get_request()
        if self.tls_context is not None:
            # The handshake happens on a worker, when the client first sends, so it cannot stall the accept loop.
            sock = self.tls_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    def process_request(self, request: Any, client_address: Any) -> None:
        self.pool.add(Connection(request, client_address, None))

    def _serve_one(self, connection: Connection) -> bool:
        """Answer one request on ``connection``; True to keep it open for the next."""
        handler = connection.handler
        try:
            if handler is None:
                handler = connection.handler = _Handler.__new__(_Handler)
                handler.request, handler.client_address, handler.server = connection.sock, connection.address, self
                handler.setup()
                if not isinstance(connection.sock, ssl.SSLSocket):
                    handler.rfile.close()
                    handler.rfile = connection.reader()  # what the selector read ahead comes first
            handler.close_connection = True
            handler.handle_one_request()
        except (ssl.SSLError, ConnectionError, TimeoutError, OSError) as exc:
            log.debug("connection from %s ended: %s", connection.address[0], exc)
            return False
        return not handler.close_connection

    def _close_connection(self, connection: Connection) -> None:
        if connection.handler is not None:
            with contextlib.suppress(OSError, ValueError):
                connection.handler.finish()
        self.shutdown_request(connection.sock)

    def server_close(self) -> None:
        super().server_close()
        pool = getattr(self, "pool", None)  # absent when binding failed in __init__
        if pool is not None:
            pool.close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; with Nagle's algorithm on, a keep-alive client waits ~40 ms for the
    # body (delayed ACK). Measured: a 1,000-node --all-nodes round took 2.8 s with it, and see bench_sim_serve now.
    disable_nagle_algorithm = True
    server_version = "gpulens-exporter"
    sys_version = ""
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.pool.read_timeout_s)
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.do_handshake()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.client_address[0], format % args)

    # -- responses ------------------------------------------------------------------------------------------------

    def _send(self, status: int, body: bytes, content_type: str, headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, doc: Any) -> None:
        self._send(status, json.dumps(doc, separators=(",", ":")).encode(), JSON_CONTENT_TYPE)

    def _authorized(self) -> bool:
        if self.server.web.authorized(self.headers.get("Authorization")):
            return True
        self._send(HTTPStatus.UNAUTHORIZED, b"Unauthorized\n", "text/plain; charset=utf-8", CHALLENGE)
        return False

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        if not self._authorized():
            return
        path = unquote(urlsplit(self.path).path).rstrip("/") or "/"
        routes = self.server.routes
        if routes.single is not None:
            self._node_path(routes.single, path)
            return
        if path == "/":
            self._index(sorted(routes.nodes))
            return
        if path == "/api/v1/nodes":
            self._json(HTTPStatus.OK, sorted(routes.nodes))
            return
        if path == "/healthz":
            self._json(HTTPStatus.OK, {"status": "ok", "nodes": len(routes.nodes)})
            return
        if path.startswith("/node/"):
            name, _, rest = path[len("/node/") :].partition("/")
            endpoint = routes.nodes.get(name)
            if endpoint is None:
                self._json(HTTPStatus.NOT_FOUND, {"error": f"unknown node {name!r}"})
                return
            self._node_path(endpoint, "/" + rest if rest else "/")
            return
        self._json(HTTPStatus.NOT_FOUND, {"error": "not found; see /node/<name>/metrics", "path": path})

    def _node_path(self, endpoint: NodeEndpoint, path: str) -> None:
        if path == "/":
            self._index(None)
            return
        if path not in ("/metrics", "/api/v1/snapshot", "/healthz"):
            self._json(HTTPStatus.NOT_FOUND, {"error": "not found", "path": path})
            return
        published = endpoint.published()
        if published.unavailable:
            self._json(HTTPStatus.SERVICE_UNAVAILABLE, {"status": "unavailable", **published.health_doc})
        elif path == "/metrics":
            if self._gzip_accepted():
                self._send(HTTPStatus.OK, published.metrics_gzip, METRICS_CONTENT_TYPE, {"Content-Encoding": "gzip"})
            else:
                self._send(HTTPStatus.OK, published.metrics, METRICS_CONTENT_TYPE)
        elif path == "/api/v1/snapshot":
            if published.snapshot is None:
                # No current snapshot (collection failing or stale): say so rather than serve old data as new.
                self._json(HTTPStatus.SERVICE_UNAVAILABLE, {"status": "unhealthy", **published.health_doc})
            else:
                self._snapshot(published)
        elif published.healthy:
            self._json(HTTPStatus.OK, {"status": "ok", **published.health_doc})
        else:
            self._json(HTTPStatus.SERVICE_UNAVAILABLE, {"status": "unhealthy", **published.health_doc})

    def _snapshot(self, published: Published) -> None:
        """The snapshot in the layout the client asked for (``?layout=columnar``; docs/snapshot.md), rows by default,
        with every link or only the inactive ones (``?links=inactive``, what the collector asks for)."""
        query = parse_qs(urlsplit(self.path).query)
        [layout] = query.get("layout", [LAYOUT_ROWS])[-1:]
        [links] = query.get("links", [LINKS_ALL])[-1:]
        if layout not in LAYOUTS:
            self._json(HTTPStatus.BAD_REQUEST, {"error": f"unknown layout {layout[:40]!r}; use one of {list(LAYOUTS)}"})
        elif links not in LINK_SCOPES:
            self._json(
                HTTPStatus.BAD_REQUEST, {"error": f"unknown links {links[:40]!r}; use one of {list(LINK_SCOPES)}"}
            )
        elif self._gzip_accepted():
            body = published.snapshot_body(layout, gzipped=True, links=links)
            self._send(HTTPStatus.OK, body, JSON_CONTENT_TYPE, {"Content-Encoding": "gzip"})
        else:
            self._send(HTTPStatus.OK, published.snapshot_body(layout, gzipped=False, links=links), JSON_CONTENT_TYPE)

    def _gzip_accepted(self) -> bool:
        return "gzip" in self.headers.get("Accept-Encoding", "")

    def _index(self, nodes: list[str] | None) -> None:
        if nodes is None:
            links = (
                '<a href="metrics">metrics</a> · <a href="api/v1/snapshot">snapshot</a> · <a href="healthz">healthz</a>'
            )
        else:
            links = "<br>".join(
                f'<a href="/node/{h}/metrics">{h}</a> (<a href="/node/{h}/api/v1/snapshot">snapshot</a>)'
                for h in map(html.escape, nodes)
            )
        body = f"<!doctype html><title>gpulens exporter</title><h1>gpulens exporter</h1><p>{links}</p>\n"
        self._send(HTTPStatus.OK, body.encode(), "text/html; charset=utf-8")


class ExporterServer:
    """An HTTP(S) server for the exporter's endpoints, run on a background thread or in the foreground."""

    def __init__(
        self,
        routes: Routes,
        *,
        host: str = "0.0.0.0",
        port: int = 9410,
        web: WebConfig | None = None,
        workers: int = DEFAULT_WORKERS,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    ):
        self._server = _Server((host, port), routes, web or WebConfig(), workers=workers, idle_timeout_s=idle_timeout_s)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def open_connections(self) -> int:
        return self._server.pool.open_connections

    @property
    def scheme(self) -> str:
        return "https" if self._server.tls_context is not None else "http"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, name="gpulens-http", daemon=True)
        self._thread.start()

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=10)
            self._thread = None
        self._server.server_close()
