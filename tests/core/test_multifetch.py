"""Many GETs at once over libcurl (gpulens.multifetch), against real servers on 127.0.0.1 that misbehave."""

from __future__ import annotations

import gzip
import os
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import trustme

from gpulens.multifetch import ABORTED, Get, MultiFetcher, Outcome

SLACK_S = 2.0  # a bound on the work done after a deadline, not a performance threshold


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    connections: set[tuple[str, int]]
    in_flight: int
    most_in_flight: int
    headers_seen: list[dict[str, str]]
    lock: threading.Lock
    stop: threading.Event

    def handle_error(self, request: object, client_address: object) -> None:
        """Clients that give up (the deadline and abort tests) are expected."""


class _Handler(BaseHTTPRequestHandler):
    """The path picks the behaviour."""

    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, body: bytes, status: int = 200, **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        with self.server.lock:
            self.server.connections.add(self.client_address)
            self.server.headers_seen.append({k.lower(): v for k, v in self.headers.items()})
            self.server.in_flight += 1
            self.server.most_in_flight = max(self.server.most_in_flight, self.server.in_flight)
        try:
            self._answer(self.path)
        finally:
            with self.server.lock:
                self.server.in_flight -= 1

    def _answer(self, path: str) -> None:
        if path.startswith("/slow"):
            time.sleep(0.2)
            self._send(b"slow")
        elif path.startswith("/drip"):
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            for _ in range(2000):  # one byte every 50 ms: far past any deadline here
                if self.server.stop.wait(0.05):
                    return
                self.wfile.write(b"#")
                self.wfile.flush()
        elif path.startswith("/error"):
            self._send(b"oops", status=500)
        elif path.startswith("/redirect"):
            self._send(b"", status=302, Location="http://127.0.0.1:1/elsewhere")
        elif path.startswith("/huge-declared"):
            self.send_response(200)
            self.send_header("Content-Length", "10000000")
            self.end_headers()
            self.wfile.write(b"x" * 1000)
        elif path.startswith("/huge-chunked"):
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for _ in range(100):
                self.wfile.write(b"2710\r\n" + b"x" * 10_000 + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        elif path.startswith("/bomb"):
            self._send(gzip.compress(b" " * 5_000_000), Content_Encoding="gzip")
        elif path.startswith("/corrupt-gzip"):
            self._send(b"\x1f\x8b\x08\x00 this is not deflate at all", Content_Encoding="gzip")
        elif path.startswith("/truncated"):
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b"x" * 10)
            self.wfile.flush()
            self.close_connection = True
        elif path.startswith("/gzip"):
            self._send(gzip.compress(b"hello " * 1000), Content_Encoding="gzip")
        else:
            self._send(path.encode())


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.connections, srv.headers_seen, srv.lock, srv.stop = set(), [], threading.Lock(), threading.Event()
    srv.in_flight = srv.most_in_flight = 0
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.stop.set()
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def fetcher() -> Iterator[MultiFetcher]:
    f = MultiFetcher()
    yield f
    f.close()


def base(srv: _Server) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}"


def fetch(fetcher: MultiFetcher, gets: list[Get], concurrency: int = 8) -> list[Outcome]:
    out: dict[int, Outcome] = {}
    fetcher.run(gets, out.__setitem__, concurrency=concurrency)
    assert sorted(out) == list(range(len(gets)))  # every GET ends exactly once
    return [out[i] for i in range(len(gets))]


def get(url: str, timeout_s: float = 1.0, max_bytes: int = 100_000, **kwargs: object) -> Get:
    return Get(url=url, timeout_s=timeout_s, max_bytes=max_bytes, **kwargs)  # type: ignore[arg-type]


def test_many_gets_each_answered_in_order_of_their_index(server: _Server, fetcher: MultiFetcher) -> None:
    urls = [f"{base(server)}/n{i}" for i in range(40)]
    outcomes = fetch(fetcher, [get(u) for u in urls], concurrency=6)
    assert [o.body for o in outcomes] == [f"/n{i}".encode() for i in range(40)]
    assert {o.status for o in outcomes} == {200}
    assert all(o.error is None and o.seconds >= 0 for o in outcomes)
    assert server.most_in_flight <= 6  # never more transfers at once than asked


def test_connections_are_kept_alive_between_batches(server: _Server, fetcher: MultiFetcher) -> None:
    for _ in range(5):
        fetch(fetcher, [get(f"{base(server)}/a")], concurrency=1)
    assert len(server.connections) == 1  # one connection served all five batches


def test_gzip_is_unzipped_and_headers_are_sent(server: _Server, fetcher: MultiFetcher) -> None:
    [outcome] = fetch(fetcher, [get(f"{base(server)}/gzip", headers=("Authorization: Basic dTpw",))])
    assert outcome.body == b"hello " * 1000
    seen = server.headers_seen[-1]
    assert seen["authorization"] == "Basic dTpw"
    assert "gzip" in seen["accept-encoding"]
    assert seen["user-agent"] == "gpulens"


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("/huge-declared", "larger than the limit of 100000 bytes"),
        ("/huge-chunked", "larger than the limit of 100000 bytes"),
        ("/bomb", "larger than the limit of 100000 bytes"),
        ("/corrupt-gzip", "corrupt gzip"),
        ("/truncated", "truncated"),
        ("/drip", "timed out after 1s"),
    ],
)
def test_each_misbehaviour_fails_alone_with_a_reason_and_the_others_are_answered(
    server: _Server, fetcher: MultiFetcher, path: str, error: str
) -> None:
    started = time.monotonic()
    bad, good = fetch(fetcher, [get(f"{base(server)}{path}"), get(f"{base(server)}/slow")])
    assert time.monotonic() - started < 1.0 + SLACK_S
    assert error in (bad.error or ""), bad
    assert (good.body, good.error) == (b"slow", None)


def test_statuses_are_answers_and_redirects_are_not_followed(server: _Server, fetcher: MultiFetcher) -> None:
    error, redirect = fetch(fetcher, [get(f"{base(server)}/error"), get(f"{base(server)}/redirect")])
    assert (error.status, error.body, error.reason) == (500, b"oops", "HTTP 500 Internal Server Error")
    assert (redirect.status, redirect.reason) == (302, "HTTP 302 Found")


def test_refused_and_unresolvable(fetcher: MultiFetcher) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        refused, unknown = fetch(fetcher, [get(f"http://127.0.0.1:{port}/"), get("http://no-such-host.invalid/")])
    assert refused.error == "connection refused"
    assert unknown.error == "cannot resolve the host"


def test_the_environment_proxy_is_not_used(
    server: _Server, fetcher: MultiFetcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:1")  # nothing listens there: using it would fail
    [outcome] = fetch(fetcher, [get(f"{base(server)}/direct")])
    assert outcome.body == b"/direct"


def test_abort_from_another_thread_ends_every_transfer_at_once(server: _Server, fetcher: MultiFetcher) -> None:
    gets = [get(f"{base(server)}/drip", timeout_s=60)] * 3 + [get(f"{base(server)}/later")] * 5
    threading.Timer(0.5, fetcher.abort).start()
    started = time.monotonic()
    outcomes = fetch(fetcher, gets, concurrency=3)
    assert time.monotonic() - started < 0.5 + SLACK_S
    assert [o.error for o in outcomes] == [ABORTED] * 8  # in flight, and never started
    assert fetch(fetcher, [get(f"{base(server)}/after")])[0].error == ABORTED  # and every later batch


def test_descriptors_above_1024_are_watched(server: _Server, fetcher: MultiFetcher) -> None:
    """select() cannot watch a descriptor numbered 1,024 or more; the collector keeps one connection per target."""
    holders = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        outcomes = fetch(fetcher, [get(f"{base(server)}/high{i}") for i in range(4)])
    finally:
        for fd in holders:
            os.close(fd)
    assert [o.body for o in outcomes] == [f"/high{i}".encode() for i in range(4)]


def test_https_with_a_ca_file_insecure_and_untrusted(tmp_path: Path, fetcher: MultiFetcher) -> None:
    ca = trustme.CA()
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.connections, srv.headers_seen, srv.lock, srv.stop = set(), [], threading.Lock(), threading.Event()
    srv.in_flight = srv.most_in_flight = 0
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    srv.socket = context.wrap_socket(srv.socket, server_side=True)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    url = f"https://127.0.0.1:{srv.server_address[1]}/tls"
    try:
        trusted, insecure, untrusted = fetch(
            fetcher, [get(url, ca_file=str(ca_file)), get(url, insecure=True), get(url)], concurrency=1
        )
    finally:
        srv.shutdown()
        srv.server_close()
    assert trusted.body == insecure.body == b"/tls"
    assert (untrusted.error or "").startswith("TLS failed"), untrusted
