"""The exporter's HTTP endpoints over real sockets on 127.0.0.1: metrics, snapshot, healthz, auth and TLS."""

from __future__ import annotations

import base64
import gzip
import http.client
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import trustme
from prometheus_client.parser import text_string_to_metric_families

from gpulens.clock import ManualClock
from gpulens.config import ConfigError
from gpulens.exporter import metrics as metrics_module
from gpulens.exporter import poller as poller_module
from gpulens.exporter.httpserver import ExporterServer, Routes
from gpulens.exporter.poller import OnDemandNode, Poller
from gpulens.model import NodeUnavailableError, SourceError
from gpulens.snapshotcodec import snapshot_from_json
from gpulens.webconfig import load_web_config
from tests.conftest import http_get
from tests.fakes.static_source import StaticSource, node_snapshot


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_700_000_000.0)


@pytest.fixture
def source(clock: ManualClock) -> StaticSource:
    return StaticSource(node_snapshot(gpus=8), clock)


@pytest.fixture
def poller(source: StaticSource, clock: ManualClock) -> Poller:
    p = Poller(source, interval_s=1.0, clock=clock)
    p.collect_once()
    return p


def serve(routes: Routes, **kwargs) -> ExporterServer:
    server = ExporterServer(routes, host="127.0.0.1", port=0, **kwargs)
    server.start()
    return server


@pytest.fixture
def server(poller: Poller) -> Iterator[ExporterServer]:
    s = serve(Routes(single=poller))
    yield s
    s.close()


def url(server: ExporterServer, path: str) -> str:
    return f"{server.scheme}://127.0.0.1:{server.port}{path}"


def test_metrics_are_served_plain_and_gzipped(server: ExporterServer) -> None:
    status, headers, body = http_get(url(server, "/metrics"))
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert len(families["gpulens_gpu_up"].samples) == 8
    status, headers, zipped = http_get(url(server, "/metrics"), headers={"Accept-Encoding": "gzip"})
    assert headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(zipped) == body


def test_metrics_are_rendered_once_per_collection_and_only_when_scraped(
    server: ExporterServer, poller: Poller, monkeypatch: pytest.MonkeyPatch
) -> None:
    renders: list[bool] = []
    render = metrics_module.render_metrics

    def counting(*args: Any, **kwargs: Any) -> bytes:
        renders.append(True)
        return render(*args, **kwargs)

    monkeypatch.setattr(poller_module, "render_metrics", counting)
    for _ in range(3):
        poller.collect_once()  # collections that no scrape reads
    assert renders == []
    zipped = [http_get(url(server, "/metrics"), headers={"Accept-Encoding": "gzip"})[2] for _ in range(2)]
    plain = http_get(url(server, "/metrics"))[2]
    assert len(renders) == 1  # plain and gzipped, three scrapes: one render
    assert gzip.decompress(zipped[0]) == gzip.decompress(zipped[1]) == plain
    poller.collect_once()
    http_get(url(server, "/metrics"))
    assert len(renders) == 2


def test_snapshot_is_schema_2_and_parses_back(server: ExporterServer, source: StaticSource) -> None:
    status, headers, body = http_get(url(server, "/api/v1/snapshot"))
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    doc = json.loads(body)
    assert doc["schema"] == 2  # schema 2 added the nics and host sections
    assert doc["exporter"]["reason"] == "ok"
    snap = snapshot_from_json(doc)
    assert snap.gpus == source.snapshot.replace(timestamp=snap.timestamp).gpus
    assert len(snap.processes) == 8
    status, headers, zipped = http_get(url(server, "/api/v1/snapshot"), headers={"Accept-Encoding": "gzip"})
    assert headers["Content-Encoding"] == "gzip"
    assert json.loads(gzip.decompress(zipped)) == doc


def test_healthz_turns_503_when_collection_stalls(server: ExporterServer, poller: Poller, clock: ManualClock) -> None:
    status, _, body = http_get(url(server, "/healthz"))
    assert status == 200
    assert json.loads(body)["status"] == "ok"
    clock.advance(2.5)  # within 3 intervals
    assert http_get(url(server, "/healthz"))[0] == 200
    clock.advance(1.0)  # 3.5 s without a collection
    status, _, body = http_get(url(server, "/healthz"))
    assert status == 503
    assert "ago" in json.loads(body)["reason"]
    # Stale GPU series are withdrawn rather than served as current.
    metrics = http_get(url(server, "/metrics"))[2].decode()
    assert "gpulens_gpu_up{" not in metrics
    assert http_get(url(server, "/api/v1/snapshot"))[0] == 503
    poller.collect_once()
    assert http_get(url(server, "/healthz"))[0] == 200


def test_a_failing_source_is_counted_and_survived(server: ExporterServer, poller: Poller, source, clock) -> None:
    source.fail = SourceError("dcgm-exporter unreachable")
    for _ in range(3):
        clock.advance(1.0)
        poller.collect_once()
    families = {f.name: f for f in text_string_to_metric_families(http_get(url(server, "/metrics"))[2].decode())}
    errors = {
        s.labels["reason"]: s.value
        for s in families["gpulens_exporter_collect_errors"].samples
        if s.name.endswith("_total")
    }
    assert errors["source_failed"] == 3
    doc = json.loads(http_get(url(server, "/healthz"))[2])
    assert "unreachable" in doc["last_error"]
    source.fail = None
    poller.collect_once()
    assert http_get(url(server, "/healthz"))[0] == 200


def test_background_thread_collects_every_interval(source: StaticSource) -> None:
    p = Poller(source, interval_s=0.05)
    p.start()
    try:
        deadline = __import__("time").monotonic() + 10
        while source.reads < 3 and __import__("time").monotonic() < deadline:
            __import__("time").sleep(0.02)
    finally:
        p.stop()
    assert source.reads >= 3
    assert p.published().healthy


def test_unknown_paths_are_404(server: ExporterServer) -> None:
    assert http_get(url(server, "/nope"))[0] == 404


# -- many nodes from one process -------------------------------------------------------------------------------


class TwoNodes:
    def __init__(self) -> None:
        self.down = False

    def node_names(self) -> list[str]:
        return ["node-00", "node-01"]

    def read_node(self, node: str):
        if self.down and node == "node-01":
            raise NodeUnavailableError("exporter_down fault on node-01")
        return node_snapshot(node, gpus=2)

    def close(self) -> None:
        pass


def test_all_nodes_routes_and_an_unavailable_node() -> None:
    multi = TwoNodes()
    routes = Routes(nodes={n: OnDemandNode(multi, n) for n in multi.node_names()})
    server = serve(routes)
    try:
        assert json.loads(http_get(url(server, "/api/v1/nodes"))[2]) == ["node-00", "node-01"]
        body = http_get(url(server, "/node/node-01/metrics"))[2].decode()
        nodes = {
            s.labels["node"] for f in text_string_to_metric_families(body) for s in f.samples if "node" in s.labels
        }
        assert nodes == {"node-01"}
        assert (
            snapshot_from_json(json.loads(http_get(url(server, "/node/node-00/api/v1/snapshot"))[2])).node == "node-00"
        )
        multi.down = True
        assert http_get(url(server, "/node/node-01/metrics"))[0] == 503
        assert http_get(url(server, "/node/node-01/healthz"))[0] == 503
        assert http_get(url(server, "/node/node-00/metrics"))[0] == 200
        assert http_get(url(server, "/node/node-99/metrics"))[0] == 404
    finally:
        server.close()


# -- web config: basic auth and TLS ----------------------------------------------------------------------------


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


@pytest.fixture
def auth_config(tmp_path: Path) -> Path:
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode().replace("$2b$", "$2y$")
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    return path


def test_basic_auth_rejects_wrong_passwords(poller: Poller, auth_config: Path) -> None:
    server = serve(Routes(single=poller), web=load_web_config(auth_config))
    try:
        status, headers, _ = http_get(url(server, "/metrics"))
        assert status == 401
        assert headers["WWW-Authenticate"].startswith("Basic")
        assert http_get(url(server, "/metrics"), headers=basic("prometheus", "wrong"))[0] == 401
        assert http_get(url(server, "/metrics"), headers=basic("nobody", "s3cret"))[0] == 401
        assert http_get(url(server, "/metrics"), headers={"Authorization": "Basic !!!"})[0] == 401
        for _ in range(2):  # the second success comes from the cache
            assert http_get(url(server, "/metrics"), headers=basic("prometheus", "s3cret"))[0] == 200
    finally:
        server.close()


class CountingCheck:
    """bcrypt.checkpw, counted: the work a login attempt costs."""

    def __init__(self) -> None:
        self.calls: list[bytes] = []

    def __call__(self, password: bytes, hashed: bytes) -> bool:
        self.calls.append(hashed)
        return bcrypt.checkpw(password, hashed)


def test_unknown_and_known_users_cost_the_same_bcrypt_work(poller: Poller, auth_config: Path) -> None:
    """Timing must not reveal user names: an unknown user is checked against a dummy hash of the same cost."""
    web = load_web_config(auth_config)
    assert web.basic_auth is not None
    counting = CountingCheck()
    web.basic_auth.checkpw = counting
    server = serve(Routes(single=poller), web=web)
    try:
        per_attempt = []
        for user in ("nobody", "prometheus", "admin", "prometheus"):
            before = len(counting.calls)
            assert http_get(url(server, "/metrics"), headers=basic(user, "wrong"))[0] == 401
            per_attempt.append(len(counting.calls) - before)
        assert per_attempt == [1, 1, 1, 1]
        real = web.basic_auth.users["prometheus"]
        dummy = counting.calls[0]
        assert dummy != real
        assert dummy.split(b"$")[2] == real.split(b"$")[2] == b"04"  # the same cost as the real hashes
    finally:
        server.close()


def test_tls_with_a_test_certificate(poller: Poller, tmp_path: Path, auth_config: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "server.key"))
    config = tmp_path / "tls.yml"
    auth = auth_config.read_text()
    config.write_text(f"tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n{auth}")
    server = serve(Routes(single=poller), web=load_web_config(config))
    try:
        assert server.scheme == "https"
        client = ssl.create_default_context()
        ca.configure_trust(client)
        status, _, body = http_get(url(server, "/metrics"), headers=basic("prometheus", "s3cret"), context=client)
        assert status == 200
        assert b"gpulens_gpu_up" in body
        untrusting = ssl.create_default_context()
        with pytest.raises(OSError, match="CERTIFICATE_VERIFY_FAILED"):
            http_get(url(server, "/metrics"), context=untrusting)
        # The server survives a failed handshake and keeps serving.
        assert http_get(url(server, "/healthz"), headers=basic("prometheus", "s3cret"), context=client)[0] == 200
    finally:
        server.close()


@pytest.mark.parametrize(
    ("text", "key", "line"),
    [
        ("tls_server_config:\n  cert_file: missing.pem\n  key_file: missing.key\n", "tls_server_config.cert_file", 2),
        ("tls_server_config:\n  bogus: 1\n", "tls_server_config.bogus", 2),
        ("basic_auth_users:\n  alice: plaintext-password\n", "basic_auth_users.alice", 2),
        ("# web\nunknown_section: {}\n", "unknown_section", 2),
        ("tls_server_config:\n  cert_file: [a, b]\n  key_file: k\n", "tls_server_config.cert_file", 2),
        (
            "tls_server_config:\n  cert_file: c\n  key_file: k\n\n  min_version: TLS9\n",
            "tls_server_config.min_version",
            5,
        ),
        ("basic_auth_users:\n  alice: 12345\n", "basic_auth_users.alice", 2),
        ("# web\n\ntls_server_config: yes\n", "tls_server_config", 3),
    ],
)
def test_bad_web_configs_name_file_key_and_line(tmp_path: Path, text: str, key: str, line: int) -> None:
    path = tmp_path / "web.yml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_web_config(path)
    assert (info.value.file, info.value.key, info.value.line) == (str(path), key, line)
    assert "plaintext-password" not in str(info.value)


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_text("basic_auth_users:\n  a: [unclosed\n")
    with pytest.raises(ConfigError) as info:
        load_web_config(path)
    assert info.value.line == 3


# -- bounded connections ---------------------------------------------------------------------------------------


def test_idle_connections_hold_no_thread_and_metrics_still_answer(server: ExporterServer) -> None:
    """1,500 half-open connections once made 1,503 threads: now idle sockets wait in one selector thread."""
    before = threading.active_count()
    idle = []
    try:
        for _ in range(200):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            idle.append(sock)
        half = idle[:100]
        for sock in half:  # half of them start a request and never finish it
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        deadline = time.monotonic() + 10
        while server.open_connections < 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.open_connections == 200
        assert threading.active_count() <= before + 2  # no thread per connection (pool threads started earlier)
        status, _, body = http_get(url(server, "/metrics"), timeout=10)
        assert status == 200
        assert b"gpulens_gpu_utilization_ratio" in body
    finally:
        for sock in idle:
            sock.close()


def test_keep_alive_connections_serve_many_requests(server: ExporterServer) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        for _ in range(3):
            connection.request("GET", "/metrics")
            response = connection.getresponse()
            assert response.status == 200
            assert response.read()
            assert connection.sock is not None  # the same socket, kept open
        first = connection.sock
        connection.request("GET", "/healthz")
        response = connection.getresponse()
        response.read()
        assert connection.sock is first
    finally:
        connection.close()


def test_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout(poller: Poller) -> None:
    server = ExporterServer(Routes(single=poller), host="127.0.0.1", port=0, workers=2, idle_timeout_s=0.5)
    server.start()
    try:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        with sock:
            assert sock.recv(1) == b""  # closed by the server, not by our read timeout
        assert server.open_connections == 0
    finally:
        server.close()
