"""Each fabric and host fault kind shows its signature on its port, host or job, and the effect the job would feel."""

from __future__ import annotations

import statistics

import pytest

from gpulens.exporter.sim import SimCluster
from gpulens.fabricmodel import NicReading
from tests.sim.support import SMALL_GPUS, TRAIN_GPUS, at, cluster, num, readings, steps

NDR = 400e9 / 8


@pytest.fixture(scope="module")
def base() -> SimCluster:
    return cluster()


def fault(kind: str, target: str, start: str, duration: str | None = None, extra: str = "") -> str:
    lines = ["[[faults]]", f'kind = "{kind}"', *target.split("\n"), f'at = "{start}"']
    if duration is not None:
        lines.append(f'duration = "{duration}"')
    return "\n" + "\n".join(lines) + "\n" + extra


def port(sim: SimCluster, node: str, device: str, t: float) -> NicReading:
    return next(p for p in sim.snapshot(node, t).nics if p.device == device)


def job_ports(sim: SimCluster, t: float) -> list[NicReading]:
    """Every port next to the 16-GPU job "train" (all of node-00's and node-01's)."""
    return [p for node in ("node-00", "node-01") for p in sim.snapshot(node, t).nics]


def test_ib_link_down(base: SimCluster) -> None:
    sim = cluster(fault("ib_link_down", 'node = "node-01"\nnic = "mlx5_2"', "20m", "5m"))
    s = sim.scenario
    before = port(sim, "node-01", "mlx5_2", at(s, 19))
    assert before.up
    assert num(before.transmit_bytes_per_second) > 0
    for t in steps(s, 20, 25):  # the whole window reads down
        down = port(sim, "node-01", "mlx5_2", t)
        assert (down.up, down.state, down.phys_state) == (False, "DOWN", "Polling")
        assert down.link_downed_total == num(before.link_downed_total) + 1
        assert down.transmit_bytes_per_second == down.receive_bytes_per_second == 0.0
        assert all(p.up for p in sim.snapshot("node-01", t).nics if p.device != "mlx5_2")
        # the job hangs in its collectives: every rank spins, none of its ports move data
        for r in readings(sim, TRAIN_GPUS, t):
            assert num(r.utilization_ratio) >= 0.98
            assert num(r.sm_active_ratio) < 0.1
        assert {p.transmit_bytes_per_second for p in job_ports(sim, t)} == {0.0}
        assert sim.snapshot("node-02", t) == base.snapshot("node-02", t)  # nothing else changes
    after = port(sim, "node-01", "mlx5_2", at(s, 26))
    assert after.up
    assert after.link_downed_total == num(before.link_downed_total) + 1
    assert num(statistics.median(num(r.sm_active_ratio) for r in readings(sim, TRAIN_GPUS, at(s, 26)))) > 0.4


def test_ib_link_down_on_a_job_takes_down_every_port_next_to_its_gpus() -> None:
    sim = cluster(fault("ib_link_down", 'job = "train"', "20m", "2m"))
    ports = job_ports(sim, at(sim.scenario, 21))
    assert len(ports) == 16
    assert not any(p.up for p in ports)
    assert all(p.up for p in sim.snapshot("node-02", at(sim.scenario, 21)).nics)


def test_ib_link_down_on_a_port_no_job_spanning_nodes_uses(base: SimCluster) -> None:
    sim = cluster(fault("ib_link_down", 'node = "node-02"\nnic = "mlx5_5"', "20m", "5m"))
    t = at(sim.scenario, 22)
    assert not port(sim, "node-02", "mlx5_5", t).up
    assert sim.snapshot("node-02", t).gpus == base.snapshot("node-02", t).gpus  # the single-node job never noticed


def test_ib_link_flap(base: SimCluster) -> None:
    sim = cluster(fault("ib_link_flap", 'node = "node-00"\nnic = "mlx5_5"', "20m", "6m"))
    s = sim.scenario
    times = list(steps(s, 19, 28))
    series = [port(sim, "node-00", "mlx5_5", t) for t in times]
    downs = [not p.up for p in series]
    stretches = sum(1 for a, b in zip([False, *downs], downs, strict=False) if b and not a)
    assert stretches == 3  # the default count, each seen by at least one step
    assert all(p.state == "DOWN" and p.phys_state == "Polling" for p in series if not p.up)
    first = num(series[0].link_downed_total)
    assert num(series[-1].link_downed_total) - first == 3
    assert num(series[-1].link_error_recovery_total) - num(series[0].link_error_recovery_total) == 3
    for t, down in zip(times, downs, strict=True):  # the job stalls while the port is down, and only then
        sm = statistics.median(num(r.sm_active_ratio) for r in readings(sim, TRAIN_GPUS, t))
        if down:
            assert sm < 0.1
            assert {p.transmit_bytes_per_second for p in job_ports(sim, t)} == {0.0}
        elif 20 * 60 <= t - s.start < 26 * 60:
            assert sm > 0.3
    assert sum(downs) < 0.3 * len(times)  # each down is brief


def test_ib_degraded() -> None:
    sim = cluster(fault("ib_degraded", 'node = "node-00"\nnic = "mlx5_1"', "20m", "10m"))
    s = sim.scenario
    assert port(sim, "node-00", "mlx5_1", at(s, 19)).rate_bytes_per_second == NDR
    for t in steps(s, 20, 30):
        p = port(sim, "node-00", "mlx5_1", t)
        assert (p.up, p.state, p.link_width, p.rate_bytes_per_second) == (True, "ACTIVE", 2, NDR / 2)
        assert num(p.transmit_bytes_per_second) <= 0.95 * NDR / 2
    assert port(sim, "node-00", "mlx5_1", at(s, 31)).link_width == 4


def test_ib_errors(base: SimCluster) -> None:
    sim = cluster(fault("ib_errors", 'node = "node-01"\nnic = "mlx5_7"', "20m", "10m"))
    s = sim.scenario
    start = port(sim, "node-01", "mlx5_7", at(s, 20))
    end = port(sim, "node-01", "mlx5_7", at(s, 30))
    minutes = 10
    assert num(end.symbol_errors_total) - num(start.symbol_errors_total) >= 60 * minutes
    assert num(end.receive_errors_total) - num(start.receive_errors_total) >= 30 * minutes
    assert num(end.local_link_integrity_errors_total) > num(start.local_link_integrity_errors_total)
    for t in steps(s, 21, 30):  # up, and still carrying the job's traffic
        p, healthy = port(sim, "node-01", "mlx5_7", t), port(base, "node-01", "mlx5_7", t)
        assert p.up
        assert num(p.transmit_bytes_per_second) == pytest.approx(num(healthy.transmit_bytes_per_second), rel=0.1)
    assert port(base, "node-01", "mlx5_7", at(s, 30)).symbol_errors_total == start.symbol_errors_total


def test_fabric_congestion(base: SimCluster) -> None:
    sim = cluster(fault("fabric_congestion", 'node = "node-00"\nnic = "mlx5_3"', "20m", "10m"))
    s = sim.scenario
    window = [t for t in steps(s, 20, 30) if min(num(r.utilization_ratio) for r in readings(base, TRAIN_GPUS, t)) > 0.5]
    wait = [num(port(sim, "node-00", "mlx5_3", t).transmit_wait_per_second) for t in window]
    healthy_wait = [num(port(base, "node-00", "mlx5_3", t).transmit_wait_per_second) for t in window]
    assert min(wait) > 1000 * statistics.median(healthy_wait) > 0
    # the job slows: every port of it moves about a third of its healthy traffic, each step more all-reduce
    ratios = [
        num(p.transmit_bytes_per_second) / num(h.transmit_bytes_per_second)
        for t in window
        for p, h in zip(job_ports(sim, t), job_ports(base, t), strict=True)
    ]
    assert 0.25 < statistics.median(ratios) < 0.45
    sm = statistics.median(num(r.sm_active_ratio) for t in window for r in readings(sim, TRAIN_GPUS, t))
    healthy_sm = statistics.median(num(r.sm_active_ratio) for t in window for r in readings(base, TRAIN_GPUS, t))
    assert sm < 0.85 * healthy_sm
    assert all(p.up and p.rate_bytes_per_second == NDR for t in window for p in job_ports(sim, t))
    other = port(sim, "node-00", "mlx5_4", window[0])
    assert num(other.transmit_wait_per_second) < 10_000  # only the congested port waits


def test_fabric_congestion_on_roce_raises_the_cnps() -> None:
    sim = cluster(fault("fabric_congestion", 'node = "node-03"\nnic = "mlx5_1"', "20m", "10m"))
    s = sim.scenario
    assert port(sim, "node-03", "mlx5_1", at(s, 19)).cnp_handled_per_second == 0.0
    congested = port(sim, "node-03", "mlx5_1", at(s, 25))
    assert num(congested.cnp_handled_per_second) > 10_000
    assert num(congested.cnp_handled_total) > 0
    assert num(congested.cnp_sent_total) > 0


def test_host_cpu_contention(base: SimCluster) -> None:
    sim = cluster(fault("host_cpu_contention", 'job = "small"', "20m", "10m"))
    s = sim.scenario
    for t in steps(s, 20, 30):
        for r in readings(sim, SMALL_GPUS, t):
            assert num(r.utilization_ratio) < 0.25  # the GPUs wait on the data loader
        small = next(j for j in sim.snapshot("node-02", t).job_hosts if j.job_id == "small")
        assert small.cpu_used_cores == small.cpu_limit_cores == 64.0
        assert sim.snapshot("node-00", t) == base.snapshot("node-00", t)
    healthy = next(j for j in sim.snapshot("node-02", at(s, 19)).job_hosts if j.job_id == "small")
    assert num(healthy.cpu_used_cores) < 0.6 * num(healthy.cpu_limit_cores)


def test_host_memory_pressure(base: SimCluster) -> None:
    sim = cluster(fault("host_memory_pressure", 'node = "node-02"', "20m", "10m"))
    s = sim.scenario
    for t in steps(s, 20, 30):
        snap = sim.snapshot("node-02", t)
        assert snap.host is not None
        total = num(snap.host.memory_total_bytes)
        assert num(snap.host.memory_available_bytes) < 0.01 * total
        assert 0.3 <= num(snap.host.cpu_iowait_ratio) <= 0.5
        for r in snap.gpus:
            if r.gpu in (0, 1, 4, 5, 6, 7):  # the jobs there: serve, serve2, small
                assert num(r.utilization_ratio) < 0.25
        for job in snap.job_hosts:
            assert num(job.memory_used_bytes) > 0.95 * num(job.memory_limit_bytes)
        assert sim.snapshot("node-00", t) == base.snapshot("node-00", t)
    healthy = sim.snapshot("node-02", at(s, 31)).host
    assert healthy is not None
    assert num(healthy.cpu_iowait_ratio) < 0.02
    assert num(healthy.memory_available_bytes) > 0.5 * num(healthy.memory_total_bytes)


def test_fabric_saturation() -> None:
    sim = cluster(fault("fabric_saturation", 'job = "train"', "20m", "5m"))
    s = sim.scenario
    for t in steps(s, 20, 25):
        for p in job_ports(sim, t):
            assert 0.9 <= num(p.transmit_bytes_per_second) / num(p.rate_bytes_per_second) <= 0.97
            assert 0.9 <= num(p.receive_bytes_per_second) / num(p.rate_bytes_per_second) <= 0.97
        assert min(num(r.utilization_ratio) for r in readings(sim, TRAIN_GPUS, t)) > 0.9
        assert all(num(p.transmit_bytes_per_second) == 0.0 for p in sim.snapshot("node-02", t).nics)
    after = [num(p.transmit_bytes_per_second) / num(p.rate_bytes_per_second) for p in job_ports(sim, at(s, 26))]
    assert max(after) < 0.6


def test_host_memory_pressure_on_a_job_presses_the_hosts_of_its_nodes(base: SimCluster) -> None:
    sim = cluster(fault("host_memory_pressure", 'job = "train"', "20m", "10m"))
    t = at(sim.scenario, 25)
    for node in ("node-00", "node-01"):
        host = sim.snapshot(node, t).host
        assert host is not None
        assert num(host.memory_available_bytes) < 0.01 * num(host.memory_total_bytes)
    assert max(num(r.utilization_ratio) for r in readings(sim, TRAIN_GPUS, t)) < 0.25
    assert sim.snapshot("node-02", t) == base.snapshot("node-02", t)


def test_fabric_congestion_on_a_job_congests_every_port_next_to_its_gpus() -> None:
    sim = cluster(fault("fabric_congestion", 'job = "train"', "20m", "10m"))
    ports = job_ports(sim, at(sim.scenario, 25))
    assert len(ports) == 16
    assert min(num(p.transmit_wait_per_second) for p in ports) > 1_000_000
    assert max(num(p.transmit_wait_per_second) for p in sim.snapshot("node-02", at(sim.scenario, 25)).nics) == 0
