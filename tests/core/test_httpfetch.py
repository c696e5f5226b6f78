"""The HTTP client (gpulens.httpfetch): URL redaction, and one deadline for a whole request against dripping servers."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpulens.httpfetch import (
    Deadline,
    DeadlineHTTPConnection,
    fetch_url,
    read_body,
    redact_secret_url,
    redact_url,
    request,
)
from gpulens.model import SourceError
from tests.fakes.dcgm_server import stand_in_dcgm_exporter

DEADLINE_S = 1.0
SLACK_S = 2.0  # a bound on the work done after the deadline, not a performance threshold


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        # http(s): the whole userinfo goes (a Basic-auth user name is often a token)
        ("http://alice:s3cret@host:9400/metrics", "http://***@host:9400/metrics"),
        ("http://alice:s3@cr3t@host/metrics", "http://***@host/metrics"),
        ("https://t0ken@host/metrics", "https://***@host/metrics"),
        ("http://host:9400/metrics", "http://host:9400/metrics"),
        ("https://host/hook?token=abc&x=1", "https://host/hook?token=%2A%2A%2A&x=1"),
        # databases: the role stays, the password goes
        ("postgresql+psycopg://gpulens:hunter2@db:5432/gpulens", "postgresql+psycopg://gpulens:***@db:5432/gpulens"),
        ("postgresql://u:p%40ss@h/d?sslmode=require", "postgresql://u:***@h/d?sslmode=require"),
        ("postgresql+psycopg://u@h/d?password=hunter2", "postgresql+psycopg://u@h/d?password=%2A%2A%2A"),
        ("sqlite:///gpulens.db", "sqlite:///gpulens.db"),
        ("not a url://user:hunter2@host", "not a url://user:***@host"),
    ],
)
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected


def test_redact_secret_url_keeps_scheme_host_and_port_only() -> None:
    assert (
        redact_secret_url("https://hooks.slack.com:8443/services/T0/B0/s3cr3t?x=1")
        == "https://hooks.slack.com:8443/***"
    )
    assert redact_secret_url("http://[::1") == "***"


# --- dripping servers ----------------------------------------------------------------------------------------------


class _Dripper(ThreadingHTTPServer):
    daemon_threads = True
    stop: threading.Event
    drip_headers: bool


class _DripHandler(BaseHTTPRequestHandler):
    """Answers one byte every 50 ms, for far longer than any deadline here: in the headers or in the body."""

    server: _Dripper

    def _drip(self) -> None:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n"
        body = b"#" * 100_000
        try:
            if self.server.drip_headers:
                to_drip = head + body
            else:
                self.wfile.write(head)
                self.wfile.flush()
                to_drip = body
            for byte in to_drip:
                if self.server.stop.wait(0.05):
                    return
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
        except OSError:  # the client gave up and closed the connection
            return

    def do_GET(self) -> None:
        self._drip()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self._drip()

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def dripping() -> Iterator[Callable[[bool], str]]:
    servers: list[tuple[_Dripper, threading.Thread]] = []

    def start(drip_headers: bool) -> str:
        server = _Dripper(("127.0.0.1", 0), _DripHandler)
        server.stop = threading.Event()
        server.drip_headers = drip_headers
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        servers.append((server, thread))
        return f"http://127.0.0.1:{server.server_address[1]}/metrics"

    yield start
    for server, thread in servers:
        server.stop.set()
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize("drip_headers", [False, True], ids=["body", "headers"])
def test_fetch_url_gives_up_at_its_deadline_on_a_dripping_server(
    dripping: Callable[[bool], str], drip_headers: bool
) -> None:
    url = dripping(drip_headers)
    started = time.monotonic()
    with pytest.raises(SourceError, match=r"timed out after 1 s"):
        fetch_url(url, DEADLINE_S, max_bytes=1_000_000)
    assert time.monotonic() - started < DEADLINE_S + SLACK_S


def test_a_post_gives_up_at_its_deadline_on_a_dripping_server(dripping: Callable[[bool], str]) -> None:
    url = dripping(False)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        request(url, method="POST", data=b"{}", timeout_s=DEADLINE_S, max_bytes=1_000_000, proxies=True)
    assert time.monotonic() - started < DEADLINE_S + SLACK_S


def test_a_kept_alive_connection_gets_a_new_deadline_per_request(dripping: Callable[[bool], str]) -> None:
    port = int(dripping(False).rsplit(":", 1)[1].split("/")[0])
    conn = DeadlineHTTPConnection("127.0.0.1", port, deadline=Deadline(DEADLINE_S))
    try:
        started = time.monotonic()
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        with pytest.raises(TimeoutError):
            read_body(response, response.msg, 1_000_000)
        assert time.monotonic() - started < DEADLINE_S + SLACK_S
    finally:
        conn.close()


# --- an honest server ----------------------------------------------------------------------------------------------


class _Plain(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"x" * 200_000
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def plain() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Plain)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_body_over_the_cap_is_refused_or_cut(plain: str) -> None:
    assert len(fetch_url(plain, 5.0, max_bytes=200_000)) == 200_000
    with pytest.raises(SourceError, match="200000 bytes is larger than the limit of 1000"):
        fetch_url(plain, 5.0, max_bytes=1000)
    cut = request(plain, timeout_s=5.0, max_bytes=100_000, truncate=True)
    assert (cut.status, len(cut.body)) == (200, 100_000)


def test_a_deadline_that_has_passed_refuses_to_start() -> None:
    deadline = Deadline(0.0)
    with pytest.raises(TimeoutError, match="timed out after 0 s"):
        deadline.remaining()


def test_request_refuses_other_schemes() -> None:
    with socket.socket() as sock:  # nothing listens: the scheme is refused before any connection
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ValueError, match="only http and https"):
        request(f"ftp://127.0.0.1:{port}/x", timeout_s=1.0, max_bytes=10)


def test_a_body_shorter_than_its_content_length_is_refused() -> None:
    """A dcgm-exporter that dies mid-page: http.client would quietly return the part; read_body refuses it."""
    page = b"DCGM_FI_DEV_GPU_TEMP 41\n" * 100
    with stand_in_dcgm_exporter(page) as server:
        assert fetch_url(server.url, 5.0, max_bytes=100_000) == page
        server.serve(page, cut_to=1000)
        with pytest.raises(SourceError, match=f"body is truncated: 1000 of {len(page)} bytes"):
            fetch_url(server.url, 5.0, max_bytes=100_000)
