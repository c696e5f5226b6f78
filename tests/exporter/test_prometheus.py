"""A real Prometheus server scrapes the exporter over HTTP; its API shows up == 1 and the gpulens series."""

from __future__ import annotations

from pathlib import Path

from gpulens.exporter.endpoints import Routes, exporter_server
from gpulens.exporter.poller import Poller
from tests.fakes.static_source import StaticSource, node_snapshot
from tests.prom import running_prometheus, wait_for


def test_prometheus_scrapes_the_exporter(prometheus_bin: str, tmp_path: Path) -> None:
    poller = Poller(StaticSource(node_snapshot("node-07", gpus=8)), interval_s=0.5)
    poller.start()
    server = exporter_server(Routes(single=poller), host="127.0.0.1", port=0)
    server.start()
    try:
        jobs = {"gpulens": (f"127.0.0.1:{server.port}", "/metrics")}
        with running_prometheus(prometheus_bin, tmp_path, jobs) as prom:
            up = wait_for(prom, 'up{job="gpulens"}', lambda r: bool(r) and r[0]["value"][1] == "1")
            assert up[0]["metric"]["instance"] == f"127.0.0.1:{server.port}"
            util = wait_for(prom, "gpulens_gpu_utilization_ratio", lambda r: len(r) == 8)
            assert {r["metric"]["node"] for r in util} == {"node-07"}
            assert {float(r["value"][1]) for r in util} == {0.97}
            # the exporter's own `job_id` label never collides with Prometheus' `job`
            jobs_info = wait_for(prom, "gpulens_gpu_job_info", lambda r: len(r) == 8)
            assert {(r["metric"]["job"], r["metric"]["job_id"]) for r in jobs_info} == {("gpulens", "4242")}
    finally:
        server.close()
        poller.stop()
