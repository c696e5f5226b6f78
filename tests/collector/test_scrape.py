"""Scraping targets over real HTTP on 127.0.0.1: good exporters, dcgm-exporters, and targets that misbehave."""

from __future__ import annotations

import base64
import dataclasses
import gzip
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulens.collector.scrape import Scraper, sanitize, sanitize_each
from gpulens.collector.spool import Spool
from gpulens.collector.targets import FileSd, Target, TargetSet, in_shard, shard_of
from gpulens.exporter.endpoints import Routes, exporter_server
from gpulens.exporter.poller import Poller
from gpulens.metriccatalogue import fields_in
from gpulens.settings import FileSdSettings, TlsAuth, parse_settings
from gpulens.snapshotcodec import snapshot_to_json
from tests.conftest import free_port
from tests.fakes.static_source import StaticSource, h100, node_snapshot

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm"


class Scripted(BaseHTTPRequestHandler):
    """Plays a misbehaving target: the path picks the behaviour."""

    protocol_version = "HTTP/1.1"
    good_body = b""
    authorization: ClassVar[list[str | None]] = []  # each request's Authorization header, in order
    clients: ClassVar[list[tuple[str, int]]] = []  # each request's client address (its connection), in order

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        Scripted.authorization.append(self.headers.get("Authorization"))
        Scripted.clients.append(self.client_address)
        path = self.path.split("?")[0]
        if path.startswith("/hang"):
            time.sleep(3)
            body = b"late"
        elif path.startswith("/error"):
            self.send_response(500)
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"oops")
            return
        elif path.startswith("/garbage"):
            body = b"\x00\xff not json at all"
        elif path.startswith("/truncated"):
            body = self.good_body[: len(self.good_body) // 2]
        elif path.startswith("/huge"):
            body = b"x" * 200_000
        elif path.startswith("/bomb"):
            data = gzip.compress(b"{" + b" " * 5_000_000)
            self.send_response(200)
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        elif path.startswith("/dcgm"):
            body = (FIXTURES / "current.prom").read_bytes()
        else:
            body = self.good_body
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        """A client that gave up (the timeout tests) is expected here."""


@pytest.fixture
def scripted() -> Iterator[str]:
    Scripted.good_body = json.dumps(snapshot_to_json(node_snapshot("node-05", gpus=4, t=time.time()))).encode()
    server = QuietServer(("127.0.0.1", 0), Scripted)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def scraper() -> Iterator[Scraper]:
    s = Scraper(timeout_s=1.0, max_bytes=100_000)
    yield s
    s.close()


@pytest.fixture
def exporter() -> Iterator[str]:
    poller = Poller(StaticSource(node_snapshot("node-07", gpus=8)), interval_s=1.0)
    poller.collect_once()
    server = exporter_server(Routes(single=poller), host="127.0.0.1", port=0)
    server.start()
    yield f"http://127.0.0.1:{server.port}"
    server.close()


def test_a_gpulens_exporter_is_scraped_through_its_snapshot(exporter: str, scraper: Scraper) -> None:
    result = scraper.scrape(Target(name="n7", url=exporter))
    assert result.health.up
    assert result.health.samples == 8
    assert result.snapshot is not None
    assert result.snapshot.node == "node-07"
    # asked for the inactive links only: every link of this exporter is up
    assert (result.snapshot.links, result.snapshot.links_scope) == ((), "inactive")
    assert all(g.nvlink_links_active == 18 for g in result.snapshot.gpus)
    assert result.rejected == {}


def test_a_dcgm_exporter_is_parsed(scripted: str, scraper: Scraper) -> None:
    result = scraper.scrape(Target(name="d", url=f"{scripted}/dcgm/metrics", kind="dcgm"))
    assert result.health.up, result.health.last_error
    assert result.snapshot is not None
    assert result.snapshot.source == "dcgm"
    assert result.health.samples == len(result.snapshot.gpus) > 0


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("/hang", "timed out"),
        ("/error", "HTTP 500"),
        ("/garbage", "not"),
        ("/truncated", "not JSON"),
        ("/huge", "limit"),
        ("/bomb", "limit"),
    ],
)
def test_misbehaving_targets_are_down_with_a_reason_within_their_timeout(
    scripted: str, scraper: Scraper, path: str, error: str
) -> None:
    started = time.monotonic()
    result = scraper.scrape(Target(name=path, url=f"{scripted}{path}"))
    assert time.monotonic() - started < 2.5
    assert not result.health.up
    assert error in (result.health.last_error or ""), result.health.last_error
    assert result.snapshot is None


def test_a_refusing_target(scraper: Scraper) -> None:
    result = scraper.scrape(Target(name="r", url=f"http://127.0.0.1:{free_port()}"))
    assert not result.health.up
    assert result.health.last_error == "connection refused"


def test_credentials_never_reach_the_health_record(
    scripted: str, scraper: Scraper, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCRAPE_PW", "hunter2-secret")
    target = Target(name="t", url=f"{scripted}/error", auth=TlsAuth(username="prom", password_env="SCRAPE_PW"))
    result = scraper.scrape(target)
    assert "hunter2-secret" not in repr(result.health)


def test_basic_auth_comes_from_the_targets_auth_never_from_its_url(
    scripted: str, scraper: Scraper, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCRAPE_PW", "pa:ss")
    in_url = scripted.replace("http://", "http://urluser:urlpass@")
    Scripted.authorization.clear()
    plain = scraper.scrape(Target(name="plain", url=in_url))
    auth = TlsAuth(username="prom", password_env="SCRAPE_PW")
    authed = scraper.scrape(Target(name="authed", url=in_url, auth=auth))
    assert plain.health.up, plain.health.last_error
    assert authed.health.up, authed.health.last_error
    assert Scripted.authorization == [None, "Basic " + base64.b64encode(b"prom:pa:ss").decode()]
    assert "urlpass" not in repr(authed.health)


_ABSURD = {  # field -> values a reading may be given: plausible ones and each kind of absurd one
    "memory_used_bytes": [None, 0, -1, 10**15],
    "utilization_ratio": [None, 0.5, 1.0, 1.7, float("nan")],
    "temperature_celsius": [None, 40.0, 251.0, float("nan")],
    "power_watts": [None, 300.0, 20_001.0],
    "timestamp": [1_700_000_000.0, 1_700_086_400.0, float("inf")],
    "node": ["n", "other"],
}


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_the_whole_node_shortcut_keeps_and_rejects_what_each_reading_would(data: st.DataObject) -> None:
    """``sanitize`` first checks all of a node's readings at once; its answer is the reading-by-reading one."""
    now = 1_700_000_000.0
    snap = node_snapshot("n", gpus=4, t=now)
    readings = []
    one_change = st.sampled_from([(name, value) for name, values in _ABSURD.items() for value in values])
    for g in snap.gpus:  # most readings plausible, the others off in one or two ways
        changes = dict(data.draw(st.lists(one_change, max_size=2)))
        readings.append(dataclasses.replace(g, **changes) if changes else g)
    if data.draw(st.integers(0, 4)) == 0:
        readings.append(readings[0])  # a duplicate GPU
    candidate = snap.replace(gpus=tuple(readings))
    assert sanitize(candidate, now, 300) == sanitize_each(candidate, now, 300)


def test_rounds_reuse_their_connections_one_request_per_target(scripted: str) -> None:
    """The work of a round is bounded: one request per target, and no new connection once every slot has one."""
    scraper = Scraper(timeout_s=5.0, concurrency=3)
    targets = [Target(name=f"t{i}", url=f"{scripted}/node{i}") for i in range(7)]
    Scripted.clients.clear()
    try:
        for _ in range(4):
            results = scraper.scrape_all(targets)
            assert [r.target.name for r in results] == [t.name for t in targets]
            assert all(r.health.up for r in results), [r.health.last_error for r in results]
    finally:
        scraper.close()
    assert len(Scripted.clients) == 4 * len(targets)
    assert len(set(Scripted.clients)) <= 3  # at most one connection per concurrent slot, kept across rounds


def test_absurd_readings_are_rejected_one_by_one() -> None:
    now = 1_700_000_000.0
    snap = node_snapshot("n", gpus=6, t=now)
    bad = (
        h100("n", 0, now, memory_used_bytes=-1),
        h100("n", 1, now, utilization_ratio=1.7),
        h100("n", 2, now + 86400),
        h100("n", 3, now, memory_used_bytes=10**15),
        snap.gpus[4],
        snap.gpus[4],  # the same GPU twice
    )
    kept, rejected = sanitize(snap.replace(gpus=(*bad, snap.gpus[5])), now, 300)
    assert [g.gpu for g in kept.gpus] == [4, 5]
    assert rejected == {
        "negative_value": 1,
        "ratio_above_one": 1,
        "future_timestamp": 1,
        "memory_above_total": 1,
        "duplicate_gpu": 1,
    }
    assert {p.gpu for p in kept.processes} == {4, 5}


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(data=st.data())
def test_fuzzed_payloads_never_crash_the_ingest(data: st.DataObject) -> None:
    """Random and mutated snapshot documents are either accepted (and sane) or rejected with a reason."""
    from gpulens.model import SnapshotFormatError
    from gpulens.snapshotcodec import snapshot_from_json

    doc = snapshot_to_json(node_snapshot("n", gpus=2, t=1_700_000_000.0))
    text = json.dumps(doc)
    choice = data.draw(st.integers(0, 2))
    if choice == 0:
        cut = data.draw(st.integers(0, len(text)))
        text = text[:cut]
    elif choice == 1:
        pos = data.draw(st.integers(0, len(text) - 1))
        text = text[:pos] + data.draw(st.text(max_size=5)) + text[pos + 1 :]
    else:
        text = data.draw(st.text(max_size=200))
    try:
        parsed = snapshot_from_json(json.loads(text))
    except (ValueError, SnapshotFormatError, RecursionError):
        return
    kept, _ = sanitize(parsed, 1_700_000_000.0, 300)
    for g in kept.gpus:
        assert g.memory_used_bytes is None or g.memory_used_bytes >= 0
        assert g.utilization_ratio is None or 0 <= g.utilization_ratio <= 1


# -- targets ------------------------------------------------------------------------------------------------------


def test_shards_split_targets_exactly_once() -> None:
    targets = [Target(name=f"http://node-{i:04d}:9410", url=f"http://node-{i:04d}:9410") for i in range(1000)]
    parts = [in_shard(targets, (i, 4)) for i in range(4)]
    names = [t.name for part in parts for t in part]
    assert sorted(names) == sorted(t.name for t in targets)
    assert all(150 < len(p) < 350 for p in parts)  # a fair spread
    assert shard_of("http://node-0001:9410", 4) == shard_of("http://node-0001:9410", 4)


def test_file_sd_reads_json_and_yaml_and_rereads_on_change(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps([{"targets": ["node-1:9410", "node-2:9410"]}]))
    (tmp_path / "b.yml").write_text("- targets: ['https://node-3:9410']\n  labels: {node: node-3}\n")
    sd = FileSd([FileSdSettings(files=(str(tmp_path / "*.json"), str(tmp_path / "*.yml")))])
    assert sorted(t.url for t in sd.targets()) == ["http://node-1:9410", "http://node-2:9410", "https://node-3:9410"]
    time.sleep(0.01)
    (tmp_path / "a.json").write_text(json.dumps([{"targets": ["node-9:9410"]}, {"targets": ["node-8:9410"]}]))
    assert sorted(t.url for t in sd.targets())[:2] == ["http://node-8:9410", "http://node-9:9410"]
    (tmp_path / "a.json").write_text("{broken")  # invalid: the previous targets stay
    assert len(sd.targets()) == 3
    assert sd.errors == 1


def test_target_set_merges_static_and_discovered_targets_by_name(tmp_path: Path) -> None:
    (tmp_path / "t.json").write_text(json.dumps([{"targets": ["http://a:1", "http://b:1"]}]))
    settings = parse_settings(
        f'[[targets]]\nurl = "http://a:1"\n[[file_sd]]\nfiles = ["{tmp_path / "t.json"}"]\n', "c.toml", environ={}
    )
    assert sorted(t.url for t in TargetSet(settings).current()) == ["http://a:1", "http://b:1"]


# -- spool --------------------------------------------------------------------------------------------------------


def test_spool_keeps_rounds_in_order_across_restarts_and_drops_the_oldest_past_its_limit(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool", max_bytes=10_000_000)
    for i in range(3):
        spool.append([node_snapshot(f"n{i}", gpus=2)], [])
    again = Spool(tmp_path / "spool", max_bytes=10_000_000)  # a restarted collector
    rounds = [again.load(p) for p in again.pending()]
    assert [r.snapshots[0].node for r in rounds] == ["n0", "n1", "n2"]
    assert rounds[0].snapshots[0] == node_snapshot("n0", gpus=2)
    again.append([node_snapshot("n3", gpus=2)], [])
    assert again.pending()[-1].name > again.pending()[-2].name
    small = Spool(tmp_path / "small", max_bytes=6000)
    for i in range(5):
        small.append([node_snapshot(f"n{i}", gpus=8)], [])
    assert small.dropped_rounds > 0
    assert small.load(small.pending()[-1]).snapshots[0].node == "n4"


def test_a_damaged_spool_file_is_reported(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    path = spool.append([node_snapshot("n", gpus=1)], [])
    path.write_bytes(b"not gzip")
    with pytest.raises(ValueError, match="damaged"):
        spool.load(path)


@pytest.mark.parametrize("field", fields_in("ratio"))
def test_every_ratio_of_the_catalogue_is_held_to_one(field: str) -> None:
    now = 1_700_000_000.0
    snap = node_snapshot("n", gpus=2, t=now)
    kept, rejected = sanitize(snap.replace(gpus=(h100("n", 0, now, **{field: 1.5}), snap.gpus[1])), now, 300)
    assert [g.gpu for g in kept.gpus] == [1]
    assert rejected == {"ratio_above_one": 1}
