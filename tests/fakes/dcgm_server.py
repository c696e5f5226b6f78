"""A stand-in dcgm-exporter: serves whatever page a test sets at ``/metrics`` over real HTTP on 127.0.0.1."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class StandIn(ThreadingHTTPServer):
    daemon_threads = True
    page: bytes
    cut_to: int | None  # send only this many bytes of the page, with the full Content-Length, then close
    status: int

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that gave up is expected."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/metrics"

    def serve(self, page: str | bytes, *, cut_to: int | None = None, status: int = 200) -> None:
        self.page = page.encode() if isinstance(page, str) else page
        self.cut_to = cut_to
        self.status = status


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: StandIn

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        page, cut = self.server.page, self.server.cut_to
        self.send_response(self.server.status)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(page)))
        if cut is not None:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(page if cut is None else page[:cut])
        self.wfile.flush()
        if cut is not None:
            self.close_connection = True


@contextmanager
def stand_in_dcgm_exporter(page: str | bytes = b"") -> Iterator[StandIn]:
    server = StandIn(("127.0.0.1", 0), _Handler)
    server.serve(page)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
