"""The one HTTP server (``gpulens.httpserver``) over real sockets on 127.0.0.1: the worker pool, keep-alive, idle
timeouts, TLS, basic auth and the bound on failed-login work. The exporter's and the collector's routes are tested
with their components."""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from http import HTTPStatus
from pathlib import Path

import bcrypt
import pytest
import trustme

from gpulens.authguard import AuthLimits
from gpulens.clock import ManualClock
from gpulens.httpserver import TEXT, HttpServer, Request, Response
from gpulens.webconfig import WebConfig, load_web_config
from tests.conftest import http_get


def hello(request: Request) -> Response:
    if request.path == "/hello":
        return Response(HTTPStatus.OK, b"hello\n", TEXT, {"X-Route": "hello"})
    return Response(HTTPStatus.NOT_FOUND, b"no\n", TEXT)


@pytest.fixture
def start() -> Iterator[Callable[..., HttpServer]]:
    servers: list[HttpServer] = []

    def make(app: Callable[[Request], Response] = hello, **kwargs) -> HttpServer:
        server = HttpServer(app, host="127.0.0.1", port=0, **kwargs)
        servers.append(server)
        server.start()
        return server

    yield make
    for server in servers:
        server.close()


def url(server: HttpServer, path: str = "/hello") -> str:
    return f"{server.scheme}://127.0.0.1:{server.port}{path}"


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_answers_with_length_cache_header_and_head_without_body(start) -> None:
    server = start(version="gpulens-test")
    status, headers, body = http_get(url(server))
    assert (status, body, headers["X-Route"], headers["Cache-Control"]) == (200, b"hello\n", "hello", "no-store")
    assert headers["Content-Length"] == "6"
    assert headers["Server"] == "gpulens-test"
    assert http_get(url(server, "/other"))[0] == 404
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        connection.request("HEAD", "/hello")
        response = connection.getresponse()
        assert (response.status, response.getheader("Content-Length"), response.read()) == (200, "6", b"")
        connection.request("POST", "/hello", body=b"x")
        assert connection.getresponse().status == 501
    finally:
        connection.close()
    plain = start(cache_control=None)
    assert "Cache-Control" not in http_get(url(plain))[1]


# -- connections ---------------------------------------------------------------------------------------------------


def test_idle_connections_hold_no_thread_and_requests_still_answer(start) -> None:
    """Idle and half-sent connections wait in one selector thread, not on a thread each."""
    server = start()
    before = threading.active_count()
    idle = []
    try:
        for _ in range(200):
            idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
        for sock in idle[:100]:  # half of them start a request and never finish it
            sock.sendall(b"GET /hello HTTP/1.1\r\nHost: x\r\n")
        deadline = time.monotonic() + 10
        while server.open_connections < 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.open_connections == 200
        assert threading.active_count() <= before + 2  # no thread per connection (pool threads started earlier)
        assert http_get(url(server), timeout=10)[:3:2] == (200, b"hello\n")
    finally:
        for sock in idle:
            sock.close()


def test_requests_beyond_the_workers_wait_for_one_instead_of_making_threads(start) -> None:
    """workers + 6 clients whose answers take long: the extra requests queue; the thread count stays the pool's."""
    entered = threading.Semaphore(0)
    release = threading.Event()

    def slow(request: Request) -> Response:
        entered.release()
        release.wait(30)
        return Response(HTTPStatus.OK, b"slow\n", TEXT)

    before = threading.active_count()
    server = start(slow, workers=2)
    clients = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(8)]
    try:
        for sock in clients:
            sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        for _ in range(2):  # both workers busy
            assert entered.acquire(timeout=30)
        deadline = time.monotonic() + 10
        while server.open_connections < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.open_connections == 8
        assert threading.active_count() - before == 2 + 2  # the workers, the selector, the accept loop
        release.set()
        for sock in clients:
            response = http.client.HTTPResponse(sock)
            response.begin()
            assert (response.status, response.read()) == (200, b"slow\n")
    finally:
        release.set()
        for sock in clients:
            sock.close()


def test_keep_alive_connections_serve_many_requests(start) -> None:
    server = start()
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        connection.request("GET", "/hello")
        connection.getresponse().read()
        first = connection.sock
        for _ in range(3):
            connection.request("GET", "/hello")
            response = connection.getresponse()
            assert (response.status, response.read()) == (200, b"hello\n")
            assert connection.sock is first  # the same socket, kept open
    finally:
        connection.close()


def test_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout(start) -> None:
    server = start(workers=2, idle_timeout_s=0.5)
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    with sock:
        assert sock.recv(1) == b""  # closed by the server, not by our read timeout
    deadline = time.monotonic() + 5
    while server.open_connections and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.open_connections == 0


# -- basic auth and TLS --------------------------------------------------------------------------------------------


@pytest.fixture
def auth_config(tmp_path: Path) -> Path:
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode().replace("$2b$", "$2y$")
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    return path


class CountingCheck:
    """bcrypt.checkpw, counted: the work a login attempt costs; ``most`` is the most checks that ran at once."""

    def __init__(self) -> None:
        self.calls: list[bytes] = []
        self.running = 0
        self.most = 0
        self._lock = threading.Lock()

    def __call__(self, password: bytes, hashed: bytes) -> bool:
        with self._lock:
            self.calls.append(hashed)
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            return bcrypt.checkpw(password, hashed)
        finally:
            with self._lock:
                self.running -= 1


def counted(auth_config: Path) -> tuple[WebConfig, CountingCheck]:
    web = load_web_config(auth_config)
    assert web.basic_auth is not None
    counting = CountingCheck()
    web.basic_auth.checkpw = counting
    return web, counting


def test_basic_auth_rejects_wrong_passwords(start, auth_config: Path) -> None:
    server = start(web=load_web_config(auth_config))
    status, headers, body = http_get(url(server))
    assert (status, body) == (401, b"Unauthorized\n")
    assert headers["WWW-Authenticate"] == 'Basic realm="gpulens"'
    assert http_get(url(server), headers=basic("prometheus", "wrong"))[0] == 401
    assert http_get(url(server), headers=basic("nobody", "s3cret"))[0] == 401
    assert http_get(url(server), headers={"Authorization": "Basic !!!"})[0] == 401
    for _ in range(2):  # the second success comes from the cache
        assert http_get(url(server), headers=basic("prometheus", "s3cret"))[0] == 200


def test_unknown_and_known_users_cost_the_same_bcrypt_work(start, auth_config: Path) -> None:
    """Timing must not reveal user names: an unknown user is checked against a dummy hash of the same cost."""
    web, counting = counted(auth_config)
    server = start(web=web)
    per_attempt = []
    for i, user in enumerate(("nobody", "prometheus", "admin", "prometheus")):
        before = len(counting.calls)
        assert http_get(url(server), headers=basic(user, f"wrong{i}"))[0] == 401
        per_attempt.append(len(counting.calls) - before)
    assert per_attempt == [1, 1, 1, 1]
    assert web.basic_auth is not None
    real = web.basic_auth.users["prometheus"]
    dummy = counting.calls[0]
    assert dummy != real
    assert dummy.split(b"$")[2] == real.split(b"$")[2] == b"04"  # the same cost as the real hashes


def test_a_header_seen_before_costs_no_bcrypt_check_right_or_wrong(start, auth_config: Path) -> None:
    web, counting = counted(auth_config)
    server = start(web=web)
    for _ in range(5):
        assert http_get(url(server), headers=basic("prometheus", "s3cret"))[0] == 200
        assert http_get(url(server), headers=basic("prometheus", "wrong"))[0] == 401
        assert http_get(url(server), headers=basic("nobody", "wrong"))[0] == 401
    assert len(counting.calls) == 3


def get_from(server: HttpServer, source: str, headers: dict[str, str]) -> http.client.HTTPResponse:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10, source_address=(source, 0))
    connection.request("GET", "/hello", headers=headers)
    response = connection.getresponse()
    response.read()
    connection.close()
    return response


def test_failed_logins_from_one_client_cost_a_bounded_number_of_bcrypt_checks(start, auth_config: Path) -> None:
    """200 new wrong passwords from one address: ``burst`` bcrypt checks, then 429 without one. Another address
    still logs in, and the first gets one more check per ``refill_s``."""
    web, counting = counted(auth_config)
    clock = ManualClock()
    server = start(web=web, auth_limits=AuthLimits(burst=3, refill_s=10.0), clock=clock.monotonic)
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    statuses = []
    try:
        for i in range(200):
            connection.request("GET", "/hello", headers=basic("prometheus", f"guess{i}"))
            response = connection.getresponse()
            response.read()
            statuses.append(response.status)
    finally:
        connection.close()
    assert len(counting.calls) == 3
    assert statuses[:3] == [401] * 3
    assert statuses[3:] == [429] * 197
    assert response.getheader("Retry-After") == "10"
    assert server.guard.refused == 197
    assert get_from(server, "127.0.0.2", basic("prometheus", "s3cret")).status == 200  # another client
    assert len(counting.calls) == 4
    assert get_from(server, "127.0.0.1", basic("prometheus", "s3cret")).status == 200  # now known: no check
    assert get_from(server, "127.0.0.1", basic("prometheus", "guess0")).status == 401  # known wrong: no check
    assert get_from(server, "127.0.0.1", basic("prometheus", "new")).status == 429
    clock.advance(10.0)
    assert get_from(server, "127.0.0.1", basic("prometheus", "newer")).status == 401
    assert get_from(server, "127.0.0.1", basic("prometheus", "newest")).status == 429
    assert len(counting.calls) == 5


def test_bcrypt_checks_run_at_most_concurrent_at_once(start, auth_config: Path) -> None:
    web, counting = counted(auth_config)
    server = start(web=web, auth_limits=AuthLimits(concurrent=1, wait_s=60.0), workers=8)
    statuses: list[int] = []

    def login(n: int) -> None:
        statuses.append(get_from(server, f"127.0.0.{n + 2}", basic("prometheus", f"guess{n}")).status)

    threads = [threading.Thread(target=login, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert statuses == [401] * 8
    assert len(counting.calls) == 8
    assert counting.most == 1


def test_tls_with_a_test_certificate(start, tmp_path: Path, auth_config: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "server.key"))
    config = tmp_path / "tls.yml"
    config.write_text(f"tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n{auth_config.read_text()}")
    server = start(web=load_web_config(config))
    assert server.scheme == "https"
    client = ssl.create_default_context()
    ca.configure_trust(client)
    status, _, body = http_get(url(server), headers=basic("prometheus", "s3cret"), context=client)
    assert (status, body) == (200, b"hello\n")
    with pytest.raises(OSError, match="CERTIFICATE_VERIFY_FAILED"):
        http_get(url(server), context=ssl.create_default_context())
    # The server survives a failed handshake and keeps serving.
    assert http_get(url(server), headers=basic("prometheus", "s3cret"), context=client)[0] == 200
