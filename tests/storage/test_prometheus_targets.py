"""ExporterDown over Prometheus watches only the jobs that serve GPU families: a real Prometheus scrapes a live gpulens
exporter page, a dead target of the same job, a job named like the shipped config whose only target is dead, and a
down non-GPU job; the reader's targets and the exported rule's expression agree on which are watched."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpulens.exporter.metrics import ExporterHealth, render_metrics
from gpulens.storage.prometheus.reader import PromReader
from gpulens.storage.prometheus.targets import exporter_down
from tests.conftest import free_port
from tests.prom import query, running_prometheus, wait_for


class _Page(BaseHTTPRequestHandler):
    body = render_metrics(None, ExporterHealth())  # a gpulens exporter's own families (no GPU read yet)

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def prometheus(prometheus_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    live = f"127.0.0.1:{server.server_address[1]}"
    dead, dead_named, dead_node = (f"127.0.0.1:{free_port()}" for _ in range(3))
    jobs = {
        "gpu-fleet": (live, "/metrics"),  # a site's own job name: watched because a target serves gpulens families
        "gpulens": (dead_named, "/metrics"),  # the shipped job name: watched though nothing of it answers
        "node": (dead_node, "/metrics"),  # a node exporter that is down: not gpulens's to report
    }
    extra = {"gpu-fleet": {"static_configs": [{"targets": [live, dead]}]}}
    try:
        with running_prometheus(prometheus_bin, tmp_path_factory.mktemp("prom"), jobs, extra=extra) as base:
            wait_for(base, "up", lambda r: len(r) == 4)
            wait_for(base, "gpulens_exporter_build_info", lambda r: len(r) == 1)
            yield base, dead, dead_named
    finally:
        server.shutdown()
        server.server_close()


def test_the_reader_lists_only_the_watched_targets(prometheus: tuple[str, str, str]) -> None:
    base, dead, dead_named = prometheus
    [live] = [s["metric"]["instance"] for s in query(base, "gpulens_exporter_build_info")]
    targets = PromReader(f"prometheus+{base}").target_health()
    assert {t.target: t.up for t in targets} == {
        f"gpu-fleet/{live}": True,
        f"gpu-fleet/{dead}": False,
        f"gpulens/{dead_named}": False,
    }


def test_the_exported_rule_fires_for_gpulens_targets_only(prometheus: tuple[str, str, str]) -> None:
    base, dead, dead_named = prometheus
    assert len(query(base, "up == 0")) == 3  # the node job is down too
    firing = {(s["metric"]["job"], s["metric"]["instance"]) for s in query(base, exporter_down())}
    assert firing == {("gpu-fleet", dead), ("gpulens", dead_named)}
