"""The simulator behind the exporter's HTTP endpoints: live time, --all-nodes over real HTTP, a real Prometheus."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulens.clock import ManualClock
from gpulens.exporter.sim import LiveTime, SimCluster, parse_scenario
from gpulens.snapshotcodec import snapshot_from_json
from tests.conftest import free_port, http_get
from tests.prom import running_prometheus, wait_for

HUNDRED_NODES = """
[cluster]
nodes = 100
gpus_per_node = 8
gpu_model = "H100-SXM5-80GB"
seed = 2
start = "2026-01-01T00:00:00Z"
duration = "6h"  # six real minutes at --speed 60: the jobs outlast a slow test run
step = "10s"

[[jobs]]
id = "big-train"
user = "alice"
kind = "training"
gpus = ["node-00:0-7", "node-01:0-7", "node-02:0-7", "node-03:0-7"]

[[jobs]]
id = "serve"
user = "bob"
kind = "inference"
gpus = ["node-50:0"]

[[faults]]
kind = "exporter_down"
node = "node-99"
at = "0m"
"""


def test_live_time_maps_the_scenario_onto_the_real_clock() -> None:
    real = ManualClock(1_800_000_000.0)
    live = LiveTime(scenario_start=1_767_225_600.0, speed=10, clock=real)
    assert live.now() == 1_767_225_600.0
    real.advance(6)
    assert live.now() == 1_767_225_660.0  # one virtual minute per 6 real seconds
    assert live.to_real(1_767_225_660.0) == 1_800_000_006.0
    cluster = SimCluster(parse_scenario(HUNDRED_NODES), stamp=live.to_real)
    snap = cluster.snapshot("node-00", live.now())
    assert snap.timestamp == 1_800_000_006.0  # the step at 1 virtual minute, stamped in real time
    assert {g.timestamp for g in snap.gpus} == {1_800_000_006.0}
    plain = SimCluster(parse_scenario(HUNDRED_NODES)).snapshot("node-00", live.now())
    assert [g.utilization_ratio for g in plain.gpus] == [g.utilization_ratio for g in snap.gpus]


def test_live_counters_grow_at_their_real_rate() -> None:
    """At 10x speed, ten virtual seconds pass per real second; energy must still grow by ~power per real second."""
    scenario = parse_scenario(HUNDRED_NODES)
    real = ManualClock(1_800_000_000.0)
    live = LiveTime(scenario.start, speed=10, clock=real)
    cluster = SimCluster(scenario, stamp=live.to_real, counter_scale=1 / 10)
    real.advance(60)
    first = cluster.snapshot("node-00", live.now())
    real.advance(30)
    second = cluster.snapshot("node-00", live.now())
    for a, b in zip(first.gpus, second.gpus, strict=True):
        rate = (b.energy_joules_total - a.energy_joules_total) / (b.timestamp - a.timestamp)
        assert 0.5 * a.power_watts < rate < 1.5 * a.power_watts


def test_live_fault_counters_follow_virtual_time() -> None:
    """Readings carry real timestamps, but a fault's counters start at its virtual ``at``, not before."""
    scenario = parse_scenario(
        HUNDRED_NODES + '[[faults]]\nkind = "xid"\ngpu = "node-00:0"\nat = "30m"\nxid = 79\n'
        '[[faults]]\nkind = "nvlink_errors"\ngpu = "node-00:1"\nat = "30m"\nduration = "5m"\n'
    )
    real = ManualClock(1_800_000_000.0)
    live = LiveTime(scenario.start, speed=10, clock=real)
    cluster = SimCluster(scenario, stamp=live.to_real, counter_scale=1 / 10)
    real.advance(60)  # 10 virtual minutes in
    early = cluster.snapshot("node-00", live.now()).gpus
    assert early[0].xid_errors == {}
    assert early[1].nvlink_crc_flit_errors_total == 0
    real.advance(150)  # 35 virtual minutes in: both faults have happened
    late = cluster.snapshot("node-00", live.now()).gpus
    assert late[0].xid_errors == {79: 1}
    assert (late[1].nvlink_crc_flit_errors_total or 0) > 0


@pytest.fixture
def all_nodes(tmp_path: Path) -> Iterator[int]:
    scenario = tmp_path / "hundred.toml"
    scenario.write_text(HUNDRED_NODES)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpulens.cli",
            "exporter",
            "--source",
            "sim",
            "--scenario",
            str(scenario),
            "--all-nodes",
            "--listen",
            f"127.0.0.1:{port}",
            "--speed",
            "60",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if http_get(f"http://127.0.0.1:{port}/healthz", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the exporter did not start"
            time.sleep(0.2)
        yield port
    finally:
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=20)
        assert proc.returncode == 0, stderr


def test_all_nodes_serves_a_hundred_node_scenario_from_one_process(all_nodes: int) -> None:
    base = f"http://127.0.0.1:{all_nodes}"
    names = json.loads(http_get(f"{base}/api/v1/nodes")[2])
    assert len(names) == 100
    jobs = set()
    started = time.time()
    for name in names[:99]:
        status, _, body = http_get(f"{base}/node/{name}/api/v1/snapshot")
        assert status == 200, name
        snap = snapshot_from_json(json.loads(body))
        assert snap.node == name
        assert len(snap.gpus) == 8
        assert [n.device for n in snap.nics] == [f"mlx5_{i}" for i in range(8)]  # schema 2: the fabric and host
        assert snap.host is not None
        assert snap.host.cpus == 224
        assert abs(snap.timestamp - started) < 120  # live: stamped with the real clock, not 2026-01-01
        jobs |= {j.job_id for j in snap.jobs}
    assert jobs == {"big-train", "serve"}
    status, _, body = http_get(f"{base}/node/node-99/metrics")  # exporter_down fault
    assert status == 503
    assert "exporter_down" in json.loads(body)["reason"]


def test_prometheus_scrapes_several_simulated_nodes(all_nodes: int, prometheus_bin: str, tmp_path: Path) -> None:
    nodes = ["node-00", "node-01", "node-50", "node-99"]
    jobs = {n: (f"127.0.0.1:{all_nodes}", f"/node/{n}/metrics") for n in nodes}
    with running_prometheus(prometheus_bin, tmp_path, jobs) as prom:
        up = wait_for(prom, "up", lambda r: len(r) == 4)
        assert {r["metric"]["job"]: r["value"][1] for r in up} == {
            "node-00": "1",
            "node-01": "1",
            "node-50": "1",
            "node-99": "0",
        }
        util = wait_for(prom, "gpulens_gpu_utilization_ratio", lambda r: len(r) == 24)
        assert {r["metric"]["node"] for r in util} == {"node-00", "node-01", "node-50"}
        # At 60x a step lasts 1/6 s, so one sample may fall in a data-loader pause: look at the recent maximum, once
        # every series holds at least five scrapes (five virtual minutes), so that one early paused sample is not all.
        recent = "gpulens_gpu_utilization_ratio[20s]"
        peak = wait_for(prom, f"max_over_time({recent}) and count_over_time({recent}) >= 5", lambda r: len(r) == 24)
        busy = {r["metric"]["node"] for r in peak if float(r["value"][1]) > 0.5}
        assert {"node-00", "node-01"} <= busy
        info = wait_for(prom, 'gpulens_gpu_job_info{job_id="serve"}', lambda r: len(r) == 1)
        assert info[0]["metric"]["user"] == "bob"
