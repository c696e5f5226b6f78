"""The exporter's HTTP endpoints over real sockets on 127.0.0.1: metrics, snapshot, healthz, auth and TLS."""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpulens.clock import ManualClock
from gpulens.config import ConfigError
from gpulens.exporter import metrics as metrics_module
from gpulens.exporter import poller as poller_module
from gpulens.exporter.endpoints import Routes, exporter_server
from gpulens.exporter.poller import OnDemandNode, Poller
from gpulens.httpserver import HttpServer
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


def serve(routes: Routes, **kwargs) -> HttpServer:
    server = exporter_server(routes, host="127.0.0.1", port=0, **kwargs)
    server.start()
    return server


@pytest.fixture
def server(poller: Poller) -> Iterator[HttpServer]:
    s = serve(Routes(single=poller))
    yield s
    s.close()


def url(server: HttpServer, path: str) -> str:
    return f"{server.scheme}://127.0.0.1:{server.port}{path}"


def test_metrics_are_served_plain_and_gzipped(server: HttpServer) -> None:
    status, headers, body = http_get(url(server, "/metrics"))
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert len(families["gpulens_gpu_up"].samples) == 8
    status, headers, zipped = http_get(url(server, "/metrics"), headers={"Accept-Encoding": "gzip"})
    assert headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(zipped) == body


def test_metrics_are_rendered_once_per_collection_and_only_when_scraped(
    server: HttpServer, poller: Poller, monkeypatch: pytest.MonkeyPatch
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


def test_snapshot_is_schema_2_and_parses_back(server: HttpServer, source: StaticSource) -> None:
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


def test_healthz_turns_503_when_collection_stalls(server: HttpServer, poller: Poller, clock: ManualClock) -> None:
    status, _, body = http_get(url(server, "/healthz"))
    assert status == 200
    assert json.loads(body)["status"] == "ok"
    clock.advance(2.5)  # within 3 intervals
    assert http_get(url(server, "/healthz"))[0] == 200
    clock.advance(1.0)  # 3.5 s without a collection
    status, _, body = http_get(url(server, "/healthz"))
    assert status == 503
    assert "ago" in json.loads(body)["reason"]
    # A late collection is served as the last readings marked stale, with their age: /metrics answers 200.
    status, _, body = http_get(url(server, "/metrics"))
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert status == 200
    assert len(families["gpulens_gpu_up"].samples) == 8
    assert [(s.labels, s.value) for s in families["gpulens_exporter_reader_stale"].samples] == [({"reader": "gpus"}, 1)]
    assert families["gpulens_exporter_reader_age_seconds"].samples[0].value == 3.5
    # The snapshot document answers too, its GPU readings withdrawn (a collector must not store them as new).
    status, _, body = http_get(url(server, "/api/v1/snapshot"))
    doc = json.loads(body)
    assert status == 200
    assert (doc["gpus"], doc["stale"]) == ([], {"gpus": 3.5})
    assert snapshot_from_json(doc).stale == {"gpus": 3.5}
    # Past KEEP_STALE_S, /metrics withdraws the GPU series too.
    clock.advance(poller_module.KEEP_STALE_S)
    assert "gpulens_gpu_up{" not in http_get(url(server, "/metrics"))[2].decode()
    poller.collect_once()
    assert http_get(url(server, "/healthz"))[0] == 200
    body = http_get(url(server, "/metrics"))[2].decode()
    assert 'gpulens_exporter_reader_stale{reader="gpus"} 0' in body


def test_a_failing_source_is_counted_and_survived(server: HttpServer, poller: Poller, source, clock) -> None:
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


def test_unknown_paths_are_404(server: HttpServer) -> None:
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


def test_every_answer_says_no_store_and_names_the_exporter(poller: Poller, auth_config: Path) -> None:
    server = serve(Routes(single=poller), web=load_web_config(auth_config))
    try:
        for path, headers, status in [
            ("/metrics", basic("prometheus", "s3cret"), 200),
            ("/nope", basic("prometheus", "s3cret"), 404),
            ("/metrics", basic("prometheus", "wrong"), 401),
        ]:
            got, answer, _ = http_get(url(server, path), headers=headers)
            assert (got, answer["Cache-Control"], answer["Server"]) == (status, "no-store", "gpulens-exporter")
    finally:
        server.close()


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


@pytest.fixture
def auth_config(tmp_path: Path) -> Path:
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode().replace("$2b$", "$2y$")
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    return path


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
