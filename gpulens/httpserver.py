"""The HTTP(S) server of every gpulens endpoint that Prometheus or the collector scrapes: the exporter's (one node, or
every simulated node under ``/node/<name>/``) and the collector's own /metrics.

An endpoint is a function from a ``Request`` to a ``Response`` (an ``App``); the server does the rest the same way
for all of them:

- connections: HTTP/1.1 keep-alive over a fixed pool of worker threads (``gpulens.connections``). An idle connection
  waits in one selector thread, holding no worker, and is closed after ``idle_timeout_s``; a request that arrives
  while every worker is busy waits in a queue, not on a thread of its own.
- TLS and basic auth from a web config (``gpulens.webconfig``). A request without valid credentials gets 401 with a
  challenge; a client that keeps sending new wrong passwords gets 429 without a bcrypt check (``gpulens.authguard``).
- every response carries ``Content-Length`` and, where the server is given one, ``Cache-Control``; HEAD is answered
  as GET without the body; other methods get 501.

Request lines are logged at debug level, one line each, without headers (so never a credential).
"""

from __future__ import annotations

import contextlib
import email.message
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, Final
from urllib.parse import urlsplit

from gpulens.authguard import AuthGuard, AuthLimits, Verdict
from gpulens.connections import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_READ_TIMEOUT_S,
    DEFAULT_WORKERS,
    Connection,
    ConnectionPool,
)
from gpulens.webconfig import CHALLENGE, WebConfig

log = logging.getLogger(__name__)

TEXT: Final = "text/plain; charset=utf-8"


@dataclass(frozen=True)
class Request:
    method: str  # GET or HEAD
    target: str  # as sent: the path and the query
    headers: email.message.Message

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    @property
    def query(self) -> str:
        return urlsplit(self.target).query


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str
    headers: Mapping[str, str] = field(default_factory=dict)


App = Callable[[Request], Response]

UNAUTHORIZED: Final = Response(HTTPStatus.UNAUTHORIZED, b"Unauthorized\n", TEXT, CHALLENGE)


def _too_many(retry_after_s: int) -> Response:
    body = b"Too many failed logins; retry later\n"
    return Response(HTTPStatus.TOO_MANY_REQUESTS, body, TEXT, {"Retry-After": str(retry_after_s)})


class _Server(HTTPServer):
    """Accepts connections and hands them to a ``ConnectionPool``: a fixed number of threads, however many sockets."""

    allow_reuse_address = True
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        app: App,
        *,
        web: WebConfig,
        guard: AuthGuard,
        version: str,
        cache_control: str | None,
        pool: Mapping[str, Any],
    ) -> None:
        self.app = app
        self.guard = guard
        self.version = version
        self.cache_control = cache_control
        self.tls_context = web.tls.context() if web.tls else None
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, _Handler)
        self.pool = ConnectionPool(self._serve_one, self._close_connection, **pool)

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
    # body (delayed ACK): a 1,000-node --all-nodes round took 2.8 s with it.
    disable_nagle_algorithm = True
    sys_version = ""
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.pool.read_timeout_s)
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.do_handshake()

    def version_string(self) -> str:
        return self.server.version

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.client_address[0], format % args)

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        server = self.server
        address = str(self.client_address[0])
        verdict = server.guard.check(self.headers.get("Authorization"), address)
        if verdict is Verdict.DENIED:
            response = UNAUTHORIZED
        elif verdict is Verdict.REFUSED:
            response = _too_many(server.guard.retry_after_s(address))
        else:
            response = server.app(Request(self.command, self.path, self.headers))
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        if server.cache_control is not None:
            self.send_header("Cache-Control", server.cache_control)
        for key, value in response.headers.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(response.body)


class HttpServer:
    """Serves ``app`` on ``host:port`` (port 0: any free one) over HTTP, or HTTPS when ``web`` has TLS, on a
    background thread (``start``) or in the foreground (``serve_forever``).

    ``name`` names the threads; ``version`` is the ``Server`` header; ``cache_control`` goes on every response (None:
    no such header). ``workers`` threads answer requests; ``auth_limits`` bound the bcrypt work of failed logins,
    timed by ``clock``.
    """

    def __init__(
        self,
        app: App,
        *,
        host: str,
        port: int,
        web: WebConfig | None = None,
        name: str = "gpulens-http",
        version: str = "gpulens",
        cache_control: str | None = "no-store",
        workers: int = DEFAULT_WORKERS,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
        auth_limits: AuthLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        web = web or WebConfig()
        self.guard = AuthGuard(web.basic_auth, auth_limits, clock=clock)
        pool = {
            "workers": workers,
            "max_connections": max_connections,
            "idle_timeout_s": idle_timeout_s,
            "read_timeout_s": read_timeout_s,
            "name": name,
        }
        self._name = name
        self._server = _Server(
            (host, port), app, web=web, guard=self.guard, version=version, cache_control=cache_control, pool=pool
        )
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def scheme(self) -> str:
        return "https" if self._server.tls_context is not None else "http"

    @property
    def open_connections(self) -> int:
        return self._server.pool.open_connections

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, name=self._name, daemon=True)
        self._thread.start()

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=10)
            self._thread = None
        self._server.server_close()
