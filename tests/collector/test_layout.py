"""Snapshot layout negotiation over real HTTP: the collector asks for the columnar layout, the simulator's exporter
serves it, and an older exporter that ignores the request (schema 1, row layout) is still read."""

from __future__ import annotations

import dataclasses
import gzip
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulens.clock import ManualClock
from gpulens.collector.loop import Collector
from gpulens.collector.scrape import Scraper, sanitize
from gpulens.collector.targets import Target
from gpulens.exporter.endpoints import Routes, exporter_server
from gpulens.exporter.metrics import ExporterHealth
from gpulens.exporter.poller import OnDemandNode, Published
from gpulens.exporter.sim import LiveTime, SimAllNodes, SimCluster, parse_scenario
from gpulens.model import NodeSnapshot, SnapshotFormatError
from gpulens.settings import TargetSettings, default_settings
from gpulens.snapshotcodec import snapshot_from_bytes, snapshot_to_bytes, snapshot_to_json
from gpulens.storage import latest
from gpulens.storage.db import Database
from gpulens.storage.sqlreader import SqlReader
from tests.conftest import http_get
from tests.fakes.static_source import node_snapshot

SCENARIO = """
[cluster]
nodes = 3
gpus_per_node = 4
gpu_model = "H100-SXM5-80GB"
seed = 4
start = "2026-01-01T00:00:00Z"
duration = "60m"
step = "10s"

[[jobs]]
id = "train"
user = "alice"
kind = "training"
gpus = ["node-00:0-3", "node-01:0-3"]
"""


@pytest.fixture
def simulator() -> Iterator[tuple[str, SimAllNodes]]:
    """A 3-node simulated cluster behind one --all-nodes exporter, stamped now."""
    scenario = parse_scenario(SCENARIO)
    live = LiveTime(scenario.start, 1.0, clock=ManualClock(time.time()))
    multi = SimAllNodes(SimCluster(scenario, stamp=live.to_real), live)
    server = exporter_server(
        Routes(nodes={n: OnDemandNode(multi, n) for n in multi.node_names()}), host="127.0.0.1", port=0
    )
    server.start()
    yield f"http://127.0.0.1:{server.port}", multi
    server.close()


@pytest.fixture
def served_layouts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The layout and links (``columnar/inactive``) of every snapshot body the exporter sends."""
    seen: list[str] = []
    original = Published.snapshot_body

    def spy(self: Published, layout: str, *, gzipped: bool, links: str = "all") -> bytes:
        seen.append(f"{layout}/{links}")
        return original(self, layout, gzipped=gzipped, links=links)

    monkeypatch.setattr(Published, "snapshot_body", spy)
    return seen


def test_the_exporter_serves_the_layout_asked_for_and_rows_by_default(simulator: tuple[str, SimAllNodes]) -> None:
    base, _ = simulator
    plain = json.loads(http_get(f"{base}/node/node-00/api/v1/snapshot")[2])
    assert plain["layout"] == "rows"
    assert isinstance(plain["gpus"], list)
    status, headers, body = http_get(
        f"{base}/node/node-00/api/v1/snapshot?layout=columnar", headers={"Accept-Encoding": "gzip"}
    )
    assert status == 200
    assert headers["Content-Encoding"] == "gzip"
    columnar = json.loads(gzip.decompress(body))
    assert columnar["layout"] == "columnar"
    assert len(columnar["gpus"]["rows"]) == 4
    assert "node" not in columnar["gpus"]["columns"]
    status, _, body = http_get(f"{base}/node/node-00/api/v1/snapshot?layout=packed")
    assert status == 400
    assert b"unknown layout" in body
    status, _, body = http_get(f"{base}/node/node-00/api/v1/snapshot?links=some")
    assert status == 400
    assert b"unknown links" in body


class _Fixed:
    """One node serving a fixed snapshot."""

    def __init__(self, snapshot: NodeSnapshot) -> None:
        self.snapshot = snapshot

    def published(self) -> Published:
        return Published(self.snapshot, ExporterHealth(), healthy=True, health_doc={})


def test_the_exporter_sends_only_the_inactive_links_when_asked() -> None:
    snap = node_snapshot("node-00", gpus=4, t=round(time.time(), 3))
    snap = snap.replace(links=tuple(dataclasses.replace(x, active=(x.gpu, x.link) != (1, 3)) for x in snap.links))
    server = exporter_server(Routes(nodes={"node-00": _Fixed(snap)}), host="127.0.0.1", port=0)
    server.start()
    try:
        base = f"http://127.0.0.1:{server.port}/node/node-00/api/v1/snapshot"
        every = snapshot_from_bytes(http_get(f"{base}?layout=columnar")[2])
        assert (len(every.links), every.links_scope) == (4 * 18, "all")
        for layout in ("rows", "columnar"):
            doc = json.loads(http_get(f"{base}?layout={layout}&links=inactive")[2])
            assert doc["links_scope"] == "inactive"
            inactive = snapshot_from_bytes(orjson.dumps(doc))
            assert inactive.links_scope == "inactive"
            assert [(x.gpu, x.link, x.active) for x in inactive.links] == [(1, 3, False)]
            assert inactive.gpus == every.gpus
            assert inactive.replace(links=every.links, links_scope="all") == every
    finally:
        server.close()


def test_a_document_with_an_unknown_links_scope_is_refused() -> None:
    doc = snapshot_to_json(node_snapshot("node-00", gpus=1).inactive_links(), layout="columnar")
    assert snapshot_from_bytes(orjson.dumps(doc)).links_scope == "inactive"
    doc["links_scope"] = "some"
    with pytest.raises(SnapshotFormatError, match=r"^links_scope: unknown scope 'some'"):
        snapshot_from_bytes(orjson.dumps(doc))


def test_the_collector_reads_the_simulator_in_the_columnar_layout(
    simulator: tuple[str, SimAllNodes], served_layouts: list[str], db_url: str, tmp_path: Path
) -> None:
    base, multi = simulator
    scraper = Scraper(timeout_s=5.0)
    try:
        result = scraper.scrape(Target(name="n1", url=f"{base}/node/node-01"))
    finally:
        scraper.close()
    assert result.health.up, result.health.last_error
    assert served_layouts == ["columnar/inactive"]
    expected = multi.read_node("node-01")
    assert result.snapshot is not None
    assert result.snapshot.gpus == expected.gpus
    assert result.snapshot.links_scope == "inactive"
    assert result.snapshot.links == tuple(x for x in expected.links if not x.active)
    assert result.snapshot.processes == expected.processes
    assert result.snapshot.jobs == expected.jobs

    db = Database(db_url)
    db.upgrade()
    settings = dataclasses.replace(
        default_settings(environ={}),
        db_url=db_url,
        targets=tuple(TargetSettings(url=f"{base}/node/node-0{i}", name=f"node-0{i}") for i in range(3)),
        spool_dir=str(tmp_path / "spool"),
    )
    collector = Collector(settings, db)
    try:
        round_ = collector.run_round()
    finally:
        collector.close()
    try:
        assert round_.written
        assert sum(len(s.gpus) for s in round_.snapshots) == 12
        assert {g.node for g in latest.latest_readings(db)} == {"node-00", "node-01", "node-02"}
        # the fabric rides along: every port and host read is stored and counted in the collector's own metrics
        ports = sum(len(s.nics) for s in round_.snapshots)
        rows = collector.metrics.registry.get_sample_value
        assert ports > 0
        assert rows("gpulens_collector_rows_written_total", {"table": "nic_sample"}) == ports
        assert rows("gpulens_collector_rows_written_total", {"table": "host_sample"}) == 3
        assert {n.node for n in SqlReader(db).latest_nics()} == {"node-00", "node-01", "node-02"}
    finally:
        db.close()
    assert set(served_layouts) == {"columnar/inactive"}


class _OldExporter(BaseHTTPRequestHandler):
    """An exporter from before schema 2: a schema-1 row-layout document, whatever the query asks for."""

    protocol_version = "HTTP/1.1"
    body: ClassVar[bytes] = b""
    paths: ClassVar[list[str]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        type(self).paths.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)


def _schema_1(doc: dict[str, Any]) -> dict[str, Any]:
    old = {k: v for k, v in doc.items() if k not in ("nics", "host", "layout")}
    old["schema"] = 1
    for process in old["processes"]:  # the key exporters wrote before the rename
        process["used_memory_bytes"] = process.pop("memory_used_bytes")
    return old


@pytest.fixture
def old_exporter() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OldExporter)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_an_old_exporter_that_ignores_the_layout_is_read_in_rows(old_exporter: str) -> None:
    snap = node_snapshot("node-07", gpus=4, t=round(time.time(), 3))
    doc = _schema_1(snapshot_to_json(snap))
    assert "layout" not in doc
    _OldExporter.body = orjson.dumps(doc)
    _OldExporter.paths = []
    scraper = Scraper(timeout_s=5.0)
    try:
        result = scraper.scrape(Target(name="old", url=old_exporter))
    finally:
        scraper.close()
    assert result.health.up, result.health.last_error
    assert _OldExporter.paths == ["/api/v1/snapshot?layout=columnar&links=inactive"]
    assert result.snapshot is not None
    assert result.snapshot.gpus == snap.gpus
    assert result.snapshot.links == snap.links
    assert result.snapshot.processes == snap.processes
    assert all(p.memory_used_bytes is not None for p in result.snapshot.processes)
    assert result.rejected == {}


def test_the_spool_writes_columnar_and_still_reads_a_row_layout_round(tmp_path: Path) -> None:
    from gpulens.collector.spool import Spool
    from gpulens.model import TargetHealth

    snap = node_snapshot("node-03", gpus=2, t=1_700_000_000.0)
    health = TargetHealth(target="t", url="http://t/api/v1/snapshot", kind="gpulens", timestamp=1.0, up=True)
    spool = Spool(tmp_path / "spool")
    path = spool.append([snap], [health])
    written = json.loads(gzip.decompress(path.read_bytes()))
    assert written["snapshots"][0]["layout"] == "columnar"
    assert spool.load(path).snapshots == (snap,)
    # A round spooled by a collector before the columnar layout: row-layout snapshots.
    old = tmp_path / "spool" / "0000000000000007.json.gz"
    doc = {"snapshots": [snapshot_to_json(snap)], "targets": [dataclasses.asdict(health)]}
    old.write_bytes(gzip.compress(orjson.dumps(doc)))
    loaded = spool.load(old)
    assert loaded.snapshots == (snap,)
    assert loaded.targets == (health,)


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(data=st.data())
def test_fuzzed_columnar_documents_are_read_or_rejected_with_a_reason(data: st.DataObject) -> None:
    """Cut or mutated columnar text is either a sane snapshot or a SnapshotFormatError, never another exception."""
    text = snapshot_to_bytes(node_snapshot("n", gpus=2, t=1_700_000_000.0), layout="columnar")
    choice = data.draw(st.integers(0, 2))
    if choice == 0:
        text = text[: data.draw(st.integers(0, len(text)))]
    elif choice == 1:
        pos = data.draw(st.integers(0, len(text) - 1))
        text = text[:pos] + data.draw(st.binary(max_size=5)) + text[pos + 1 :]
    else:  # a column renamed: unknown to this reader, or one it needs gone
        name = data.draw(st.sampled_from([b'"uuid"', b'"pid"', b'"link"', b'"active"', b'"memory_used_bytes"']))
        text = text.replace(name, b'"' + data.draw(st.text(max_size=8)).encode() + b'"', 1)
    try:
        parsed = snapshot_from_bytes(text)
    except SnapshotFormatError:
        return
    kept, _ = sanitize(parsed, 1_700_000_000.0, 300)
    for g in kept.gpus:
        assert g.memory_used_bytes is None or g.memory_used_bytes >= 0
        assert g.utilization_ratio is None or 0 <= g.utilization_ratio <= 1
