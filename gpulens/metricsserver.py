"""A process's own /metrics for Prometheus to scrape, over HTTP or HTTPS with basic auth: the collector's endpoint.

TLS and basic auth come from a web config file (``gpulens.webconfig``, the exporter-toolkit format the exporter's
``--web-config`` reads), checked by the same code as the exporter's. The body is rendered per request by the caller's
``render`` (the collector: its registry, a few kilobytes). Each connection gets a thread; a TLS handshake happens on
that thread, with ``READ_TIMEOUT_S``, so a client that never speaks cannot stall the accept loop.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from collections.abc import Callable, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final
from urllib.parse import urlsplit

from gpulens.webconfig import CHALLENGE, WebConfig

log = logging.getLogger(__name__)

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
READ_TIMEOUT_S: Final = 10.0


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], render: Callable[[], bytes], web: WebConfig, name: str) -> None:
        self.render = render
        self.web = web
        self.name = name
        self.tls_context = web.tls.context() if web.tls else None
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, _Handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = super().get_request()
        if self.tls_context is not None:
            sock = self.tls_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection from %s ended with an error", client_address[0], exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(READ_TIMEOUT_S)
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.do_handshake()

    def handle(self) -> None:
        try:
            super().handle()
        except (ssl.SSLError, ConnectionError, TimeoutError) as exc:
            log.debug("connection from %s ended: %s", self.client_address[0], exc)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.client_address[0], format % args)

    def _send(self, status: int, body: bytes, content_type: str, headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        text = "text/plain; charset=utf-8"
        if not self.server.web.authorized(self.headers.get("Authorization")):
            self._send(HTTPStatus.UNAUTHORIZED, b"Unauthorized\n", text, CHALLENGE)
            return
        path = urlsplit(self.path).path.rstrip("/") or "/"
        if path == "/metrics":
            self._send(HTTPStatus.OK, self.server.render(), CONTENT_TYPE)
        elif path == "/":
            body = f'<!doctype html><title>{self.server.name}</title><a href="metrics">metrics</a>\n'
            self._send(HTTPStatus.OK, body.encode(), "text/html; charset=utf-8")
        else:
            self._send(HTTPStatus.NOT_FOUND, b"not found; see /metrics\n", text)


class MetricsServer:
    """Serves ``render()`` at ``/metrics`` on ``host:port`` (port 0: any free one), on a background thread."""

    def __init__(
        self, render: Callable[[], bytes], *, host: str, port: int, web: WebConfig | None = None, name: str = "gpulens"
    ) -> None:
        self._server = _Server((host, port), render, web or WebConfig(), name)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def scheme(self) -> str:
        return "https" if self._server.tls_context is not None else "http"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, name="gpulens-metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=10)
            self._thread = None
        self._server.server_close()
