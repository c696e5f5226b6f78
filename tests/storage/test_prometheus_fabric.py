"""``PromReader``'s fabric and host reads against a real Prometheus, and a real VictoriaMetrics, scraping a page of
the node agent's ``gpulens_nic_*``, ``gpulens_host_*`` and ``gpulens_job_*`` families (counters growing at known
rates)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from gpulens.nodehealth import STATES
from gpulens.settings import StoreAuth
from gpulens.storage.prometheus import PromReader
from tests.prom import running_prometheus, running_victoriametrics, wait_for

GIB = 1024**3
PORTS = (
    'node="n1",device="mlx5_0",port="1"',
    'node="n1",device="mlx5_1",port="1"',
    'node="n2",device="mlx5_0",port="1"',
)


def page(elapsed: float) -> str:
    lines = []
    for i, labels in enumerate(PORTS):
        up = 0 if i == 1 else 1
        lines += [
            f'gpulens_nic_info{{{labels},link_layer="InfiniBand",gpus="{i},{i + 1}",pci_bus_id="0000:1{i}:00.0"}} 1',
            f"gpulens_nic_up{{{labels}}} {up}",
            f"gpulens_nic_link_speed_bytes_per_second{{{labels}}} 5e10",
            f"gpulens_nic_link_width{{{labels}}} 4",
            f"gpulens_nic_transmit_bytes_total{{{labels}}} {1e8 * elapsed * up:.0f}",
            f"gpulens_nic_receive_bytes_total{{{labels}}} {2e8 * elapsed * up:.0f}",
            f"gpulens_nic_transmit_wait_total{{{labels}}} {10 * elapsed:.0f}",
            f"gpulens_nic_link_downed_total{{{labels}}} {3 * i}",
            f"gpulens_nic_symbol_errors_total{{{labels}}} 0",
            f"gpulens_nic_receive_errors_total{{{labels}}} 0",
        ]
    for node in ("n1", "n2"):
        lines += [
            f'gpulens_host_cpus{{node="{node}"}} 64',
            f'gpulens_host_cpu_busy_ratio{{node="{node}"}} 0.25',
            f'gpulens_host_cpu_iowait_ratio{{node="{node}"}} 0.02',
            f'gpulens_host_memory_total_bytes{{node="{node}"}} {2048 * GIB}',
            f'gpulens_host_memory_used_bytes{{node="{node}"}} {512 * GIB}',
            f'gpulens_host_memory_available_bytes{{node="{node}"}} {1536 * GIB}',
            f'gpulens_job_cpu_seconds_total{{node="{node}",job_id="j1"}} {4 * elapsed:.3f}',
            f'gpulens_job_cpu_limit_cores{{node="{node}",job_id="j1"}} 8',
            f'gpulens_job_memory_used_bytes{{node="{node}",job_id="j1"}} {16 * GIB}',
        ]
    for node, health, action in (("n1", "Degraded", "hardware-inspection"), ("n2", "Healthy", "none")):
        lines += [f'gpulens_node_health{{node="{node}",state="{s}"}} {int(s == health)}' for s in STATES]
        lines.append(f'gpulens_node_health_action{{node="{node}",action="{action}"}} 1')
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module", params=["prometheus", "victoriametrics"])
def prom(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    prometheus_bin: str,
    victoriametrics_bin: str,
) -> Iterator[str]:
    """Each store in turn (Prometheus, then VictoriaMetrics scraping the page itself) holding a quarter minute."""
    started = time.time()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page(time.time() - started).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    target = f"127.0.0.1:{server.server_address[1]}"
    try:
        run, binary = (
            (running_prometheus, prometheus_bin)
            if request.param == "prometheus"
            else (running_victoriametrics, victoriametrics_bin)
        )
        # VictoriaMetrics with its defaults (-search.latencyOffset=30s): the newest values are read fresh all the same
        with run(binary, tmp_path_factory.mktemp(request.param), {"agent": (target, "/metrics")}, flags=()) as base:
            wait_for(
                base, "min(count_over_time(gpulens_nic_up[1m]))", lambda r: bool(r) and float(r[0]["value"][1]) >= 15
            )
            yield base
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def reader(prom: str) -> Iterator[PromReader]:
    # rate() windows are four times min_step: 12 s here, a dozen scrapes (a PromQL rate extrapolates: within a quarter)
    prom_reader = PromReader("prometheus+" + prom, StoreAuth(min_step_s=3.0))
    yield prom_reader
    prom_reader.close()


def test_latest_ports_hosts_and_jobs(reader: PromReader) -> None:
    nics = reader.latest_nics()
    assert [(n.node, n.device, n.port) for n in nics] == [("n1", "mlx5_0", 1), ("n1", "mlx5_1", 1), ("n2", "mlx5_0", 1)]
    first = nics[0]
    assert first.up is True
    assert first.link_layer == "InfiniBand"
    assert first.gpus == (0, 1)
    assert first.pci_bus_id == "0000:10:00.0"
    assert first.rate_bytes_per_second == 5e10
    assert first.link_width == 4
    assert first.transmit_bytes_per_second == pytest.approx(1e8, rel=0.25)
    assert first.receive_bytes_per_second == pytest.approx(2e8, rel=0.25)
    assert first.transmit_wait_per_second == pytest.approx(10, rel=0.2)
    assert nics[1].up is False
    assert nics[1].link_downed_total == 3
    assert first.state is None  # only up is exported
    assert [n.device for n in reader.latest_nics(node="n2")] == ["mlx5_0"]
    assert len(reader.latest_nics(max_age_s=30)) == 3

    hosts = reader.latest_hosts()
    assert [h.node for h in hosts] == ["n1", "n2"]
    assert hosts[0].cpus == 64
    assert hosts[0].cpu_busy_ratio == 0.25
    assert hosts[0].memory_used_bytes == 512 * GIB
    assert [h.node for h in reader.latest_hosts(node="n2")] == ["n2"]

    jobs = reader.latest_job_hosts(job_id="j1")
    assert [(j.job_id, j.node) for j in jobs] == [("j1", "n1"), ("j1", "n2")]
    assert jobs[0].cpu_used_cores == pytest.approx(4.0, rel=0.25)
    assert jobs[0].cpu_limit_cores == 8
    assert jobs[0].memory_used_bytes == 16 * GIB
    assert reader.latest_job_hosts(job_id="other") == []


def test_only_the_fields_and_nodes_asked_for_are_read(reader: PromReader) -> None:
    """``fields=``: one query per field fewer for each left out, the values of those read the same as a whole read,
    the others ``None``; ``nodes=``: those nodes' ports only; ``nic_counts``: each node's ports counted in
    Prometheus, one series per node, as the whole read counts them."""
    every = {n.key: n for n in reader.latest_nics()}
    reader.present_names()  # its list of metric names read now, not inside the count
    before = reader.client.stats.queries
    reader.latest_nics()
    whole = reader.client.stats.queries - before
    wanted = ["rate_bytes_per_second", "link_width", "transmit_bytes_per_second", "link_downed_total"]
    reader.present_names()  # its list of metric names read now, not inside the count
    before = reader.client.stats.queries
    some = reader.latest_nics(fields=wanted)
    assert reader.client.stats.queries - before == 1 + len(wanted) + 1 < whole  # the labels, each field, up
    assert [n.key for n in some] == list(every)
    for n in some:
        full = every[n.key]
        assert (n.up, n.link_layer, n.gpus, n.pci_bus_id) == (full.up, full.link_layer, full.gpus, full.pci_bus_id)
        assert (n.rate_bytes_per_second, n.link_width, n.link_downed_total) == (
            full.rate_bytes_per_second,
            full.link_width,
            full.link_downed_total,
        )
        assert n.transmit_bytes_per_second == pytest.approx(full.transmit_bytes_per_second, rel=0.25)
        assert (n.receive_bytes_per_second, n.transmit_wait_per_second, n.symbol_errors_total) == (None, None, None)
    with pytest.raises(ValueError, match="unknown port fields nope"):
        reader.latest_nics(fields=["nope"])

    assert [n.key for n in reader.latest_nics(nodes=["n2"], fields=["up"])] == [("n2", "mlx5_0", 1)]
    assert [n.key for n in reader.latest_nics(nodes=["n2", "n1"])] == list(every)
    assert reader.latest_nics(nodes=[]) == []

    reader.present_names()
    queries, series = reader.client.stats.queries, reader.client.stats.series
    counts = reader.nic_counts()
    assert (reader.client.stats.queries - queries, reader.client.stats.series - series) == (2, 4)
    assert counts == {"n1": (1, 2), "n2": (1, 1)}
    assert counts == {
        node: (sum(n.up for n in every.values() if n.node == node), sum(1 for n in every.values() if n.node == node))
        for node in ("n1", "n2")
    }


def test_series_of_ports_hosts_and_jobs(reader: PromReader) -> None:
    now = time.time()
    fields = ["transmit_bytes_per_second", "up", "link_downed_total"]
    data = reader.nic_series(["n1/mlx5_0/1", "n1/mlx5_1/1", "n9/mlx5_0/1"], fields, now - 30, now, max_points=10)
    assert sorted(data) == ["n1/mlx5_0/1", "n1/mlx5_1/1"]
    port = data["n1/mlx5_0/1"]
    assert port.uuid == "n1/mlx5_0/1"
    assert port.resolution == "prometheus"
    rates = [v for v in port.values["transmit_bytes_per_second"] if v is not None]
    assert rates
    assert max(rates) == pytest.approx(1e8, rel=0.25)  # the last step may reach past now: partly covered
    assert {v for v in data["n1/mlx5_1/1"].values["up"] if v is not None} == {0.0}
    assert {v for v in port.values["link_downed_total"] if v is not None} == {0.0}
    host = reader.host_series(["n2"], ["cpu_busy_ratio", "memory_available_bytes"], now - 30, now, max_points=10)
    assert list(host) == ["n2"]
    assert {v for v in host["n2"].values["cpu_busy_ratio"] if v is not None} == {0.25}
    job = reader.job_host_series("j1", ["cpu_used_cores", "memory_used_bytes"], now - 30, now, max_points=10)
    assert sorted(job) == ["n1", "n2"]
    assert max(v for v in job["n1"].values["cpu_used_cores"] if v is not None) == pytest.approx(4.0, rel=0.25)
    with pytest.raises(ValueError, match="unknown fields power_watts"):
        reader.nic_series(["n1/mlx5_0/1"], ["power_watts"], now - 30, now)


def test_each_nodes_health_is_the_state_its_exporter_says(reader: PromReader) -> None:
    """``gpulens_node_health{state}`` and its action, two instant queries; the state without its reasons."""
    health = reader.node_health()
    assert {node: (h.state, h.action) for node, h in health.items()} == {
        "n1": ("Degraded", "hardware-inspection"),
        "n2": ("Healthy", "none"),
    }
    assert list(reader.node_health(["n2"])) == ["n2"]
    assert reader.node_health([]) == {}
