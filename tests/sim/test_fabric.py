"""The simulated fabric and host: RDMA ports by GPU model and override, the traffic jobs move over them, counters
that agree with their rates, each node's host and each job's cgroup, and scenario errors for ports."""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path

import pytest

from gpulens.config import ConfigError
from gpulens.exporter.sim import SimCluster, load_scenario, parse_scenario
from gpulens.fabricmodel import NicReading
from tests.sim.support import BASE, STEP, at, cluster, num, steps

GIB = 1 << 30
NDR = 400e9 / 8
HDR = 200e9 / 8

MODELS = """
[cluster]
nodes = 5
gpus_per_node = 8
duration = "30m"

[[nodes]]
name = "node-01"
gpu_model = "H200-SXM-141GB"

[[nodes]]
name = "node-02"
gpu_model = "A100-SXM4-80GB"

[[nodes]]
name = "node-03"
gpu_model = "L40S"
gpus_per_node = 4

[[nodes]]
name = "node-04"
nics = 2
nic_rate_gbps = 200
nic_link_layer = "Ethernet"
"""


def nics(sim: SimCluster, node: str, t: float) -> tuple[NicReading, ...]:
    return sim.snapshot(node, t).nics


def test_ports_by_gpu_model_follow_real_systems() -> None:
    sim = SimCluster(parse_scenario(MODELS, source="models.toml"))
    t = sim.scenario.start
    for node in ("node-00", "node-01"):  # HGX H100 and H200: 8 x NDR InfiniBand, one per GPU
        ports = nics(sim, node, t)
        assert [p.device for p in ports] == [f"mlx5_{i}" for i in range(8)]
        assert [p.gpus for p in ports] == [(i,) for i in range(8)]
        assert {(p.link_layer, p.rate_bytes_per_second, p.link_width, p.link_speed) for p in ports} == {
            ("InfiniBand", NDR, 4, "NDR")
        }
    a100 = nics(sim, "node-02", t)  # 4 x HDR, one per GPU pair
    assert [p.gpus for p in a100] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert {(p.link_layer, p.rate_bytes_per_second, p.link_speed) for p in a100} == {("InfiniBand", HDR, "HDR")}
    l40s = nics(sim, "node-03", t)  # 2 x 100 Gb/s RoCE
    assert [p.gpus for p in l40s] == [(0, 1), (2, 3)]
    assert {(p.link_layer, p.rate_bytes_per_second) for p in l40s} == {("Ethernet", 100e9 / 8)}
    assert all(p.is_roce and p.cnp_handled_total == 0 for p in l40s)
    assert all(p.cnp_handled_total is None for p in a100)  # CNPs are RoCE's
    for node in sim.node_names():
        for p in nics(sim, node, t):
            assert (p.up, p.state, p.phys_state, p.port, p.node) == (True, "ACTIVE", "LinkUp", 1, node)
            assert p.pci_bus_id
            assert p.numa_node in (0, 1)


def test_nodes_override_the_count_rate_and_link_layer() -> None:
    sim = SimCluster(parse_scenario(MODELS, source="models.toml"))
    ports = nics(sim, "node-04", sim.scenario.start)
    assert [p.device for p in ports] == ["mlx5_0", "mlx5_1"]
    assert [p.gpus for p in ports] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert {(p.link_layer, p.rate_bytes_per_second, p.link_speed) for p in ports} == {("Ethernet", HDR, "HDR")}


def test_a_job_spanning_nodes_moves_traffic_on_its_ports_a_single_node_job_none() -> None:
    sim = cluster()
    s = sim.scenario
    shares = []
    for t in steps(s, 2, 12):  # between checkpoints
        for node in ("node-00", "node-01"):  # the 16-GPU job "train"
            snap = sim.snapshot(node, t)
            if min(num(g.utilization_ratio) for g in snap.gpus) < 0.5:
                continue  # a data-loader pause
            shares += [num(p.transmit_bytes_per_second) / num(p.rate_bytes_per_second) for p in snap.nics]
            assert all(num(p.receive_bytes_per_second) > 0 for p in snap.nics)
        for node in ("node-02", "node-03"):  # a single-node training job, inference: no fabric traffic
            for p in nics(sim, node, t):
                assert p.transmit_bytes_per_second == p.receive_bytes_per_second == 0.0
    assert len(shares) > 50
    assert 0.04 < statistics.median(shares) < 0.3  # 30-60 % at peak, times the all-reduce share of a step
    assert max(shares) < 0.6


def test_traffic_follows_the_jobs_phases_and_stops_when_it_ends() -> None:
    sim = cluster("", BASE.replace('checkpoint_every = "15m"', 'checkpoint_every = "15m"\nend = "40m"'))
    s = sim.scenario
    for t in steps(s, 2, 14):
        snap = sim.snapshot("node-00", t)
        tx = num(snap.nics[0].transmit_bytes_per_second)
        if max(num(g.utilization_ratio) for g in snap.gpus) < 0.2:  # every rank waits for data: nothing to send
            assert tx == 0.0
    late = [sim.snapshot("node-00", t).nics[3] for t in steps(s, 41, 45)]
    assert {p.transmit_bytes_per_second for p in late} == {0.0}
    assert len({p.transmit_bytes_total for p in late}) == 1


def test_counters_are_cumulative_and_agree_with_the_rates() -> None:
    sim = cluster()
    s = sim.scenario
    times = list(steps(s, 4, 18))  # across a checkpoint
    for node in ("node-00", "node-03"):
        for i in range(len(sim.snapshot(node, times[0]).nics)):
            series = [sim.snapshot(node, t).nics[i] for t in times]
            for before, now in itertools.pairwise(series):
                sent = num(now.transmit_bytes_total) - num(before.transmit_bytes_total)
                received = num(now.receive_bytes_total) - num(before.receive_bytes_total)
                waited = num(now.transmit_wait_total) - num(before.transmit_wait_total)
                assert sent >= 0
                assert received >= 0
                assert waited >= 0
                assert sent == pytest.approx(num(now.transmit_bytes_per_second) * STEP, abs=4.0)
                assert received == pytest.approx(num(now.receive_bytes_per_second) * STEP, abs=4.0)
                assert waited == pytest.approx(num(now.transmit_wait_per_second) * STEP, abs=4.0)
                assert num(now.transmit_packets_total) >= num(before.transmit_packets_total)


def test_a_checkpoint_writes_over_the_ports_while_the_gpus_idle() -> None:
    sim = cluster()
    s = sim.scenario
    writes = 0
    for t in steps(s, 15, 17):
        snap = sim.snapshot("node-00", t)
        copying = min(num(g.pcie_tx_bytes_per_second) for g in snap.gpus) > 20e9  # the checkpoint's copy to the host
        if max(num(g.utilization_ratio) for g in snap.gpus) < 0.1 and copying:
            writes += 1
            for p in snap.nics:
                assert num(p.transmit_bytes_per_second) > 0.4 * num(p.rate_bytes_per_second)
                assert num(p.receive_bytes_per_second) < 0.01 * num(p.rate_bytes_per_second)
                assert p.up
    assert 1 <= writes <= 3  # short


def test_each_node_has_a_host_and_each_job_its_cgroup() -> None:
    sim = cluster()
    s = sim.scenario
    t = at(s, 5)
    host = sim.snapshot("node-00", t).host
    assert host is not None
    assert (host.cpus, host.memory_total_bytes) == (224, 2048 * GIB)
    assert 0.05 < num(host.cpu_busy_ratio) < 0.5
    assert num(host.cpu_iowait_ratio) < 0.02
    assert num(host.memory_used_bytes) + num(host.memory_available_bytes) == host.memory_total_bytes
    l40s = sim.snapshot("node-03", t).host
    assert l40s is not None
    assert (l40s.cpus, l40s.memory_total_bytes) == (128, 1024 * GIB)
    jobs = {j.job_id: j for j in sim.snapshot("node-02", t).job_hosts}
    assert {k: j.cpu_limit_cores for k, j in jobs.items()} == {"serve": 16.0, "serve2": 16.0, "small": 64.0}
    small = jobs["small"]
    assert small.cgroup is not None
    assert small.cgroup.startswith("/slurm/uid_")
    assert small.cgroup.endswith("/job_small")
    assert small.cgroup_version == 2
    assert 0 < num(small.cpu_used_cores) < 0.6 * num(small.cpu_limit_cores)
    assert 0 < num(small.memory_used_bytes) < num(small.memory_limit_bytes)
    assert num(jobs["serve"].cpu_used_cores) < num(small.cpu_used_cores)
    series = [{j.job_id: j for j in sim.snapshot("node-00", t).job_hosts}["train"] for t in steps(s, 5, 8)]
    for before, now in itertools.pairwise(series):
        used = num(now.cpu_seconds_total) - num(before.cpu_seconds_total)
        assert used == pytest.approx(num(now.cpu_used_cores) * STEP, abs=0.05)
    assert sim.snapshot("node-03", at(s, 5)).job_hosts != ()  # l40s inference runs there


def test_another_seed_gives_other_traffic_on_the_same_ports() -> None:
    one = cluster()
    other = SimCluster(parse_scenario(BASE.replace("seed = 5", "seed = 6"), source="test.toml"))
    t = at(one.scenario, 8)
    a, b = one.snapshot("node-00", t).nics, other.snapshot("node-00", t).nics
    assert [(p.device, p.gpus, p.rate_bytes_per_second) for p in a] == [
        (p.device, p.gpus, p.rate_bytes_per_second) for p in b
    ]
    assert [p.transmit_bytes_per_second for p in a] != [p.transmit_bytes_per_second for p in b]
    assert one.snapshot("node-00", t).nics == cluster().snapshot("node-00", t).nics


# Each malformed scenario marks the line the error must name with "# <-".
PORT_FAULT = '\n[[faults]]\nkind = "ib_errors"\nnode = "node-03"\nat = "5m"\n'
MALFORMED = {
    "a nic the node lacks": (
        BASE + PORT_FAULT + 'nic = "mlx5_2"  # <-\n',
        "faults[0].nic",
        "node-03 (L40S) has no RDMA device 'mlx5_2' (it has mlx5_0, mlx5_1)",
    ),
    "a port fault without a nic": (
        BASE + PORT_FAULT.replace("[[faults]]", "[[faults]]  # <-"),
        "faults[0].nic",
        "missing required key",
    ),
    "a port fault naming a port and a job": (
        BASE + PORT_FAULT + 'nic = "mlx5_0"\njob = "train"  # <-\n',
        "faults[0].job",
        "a ib_errors fault names a node and a nic, or a job, not both",
    ),
    "a node and a job at once": (
        BASE
        + '\n[[faults]]\nkind = "ib_link_down"\nnode = "node-00"\nnic = "mlx5_0"\njob = "train"  # <-\nat = "5m"\n',
        "faults[0].job",
        "names a node and a nic, or a job, not both",
    ),
    "a link down on a job on one node": (
        BASE + '\n[[faults]]\nkind = "ib_link_down"\njob = "small"  # <-\nat = "5m"\n',
        "faults[0].job",
        "spans 2 or more nodes",
    ),
    "too many flaps for the window": (
        BASE
        + '\n[[faults]]\nkind = "ib_link_flap"\nnode = "node-00"\nnic = "mlx5_0"\nat = "5m"\nduration = "1m"\n'
        + "count = 4  # <-\n",
        "faults[0].count",
        "do not fit",
    ),
    "cpu contention on inference": (
        BASE + '\n[[faults]]\nkind = "host_cpu_contention"\njob = "serve"  # <-\nat = "5m"\n',
        "faults[0].job",
        "needs a training job",
    ),
    "host memory pressure naming nothing": (
        BASE + '\n[[faults]]  # <-\nkind = "host_memory_pressure"\nat = "5m"\n',
        "faults[0].node",
        "missing required key (a host_memory_pressure fault names a node, or a job)",
    ),
    "host memory pressure naming a node and a job": (
        BASE + '\n[[faults]]\nkind = "host_memory_pressure"\nnode = "node-02"\njob = "small"  # <-\nat = "5m"\n',
        "faults[0].job",
        "not both",
    ),
    "host memory pressure naming a nic": (
        BASE + '\n[[faults]]\nkind = "host_memory_pressure"\nnode = "node-02"\nnic = "mlx5_0"  # <-\nat = "5m"\n',
        "faults[0].nic",
        "names a node or a job, not a nic",
    ),
    "an unknown link layer": (
        BASE.replace("gpus_per_node = 4\n", 'gpus_per_node = 4\nnic_link_layer = "Myrinet"  # <-\n', 1),
        "nodes[0].nic_link_layer",
        "unknown link layer 'Myrinet'",
    ),
    "no ports": (
        BASE.replace("gpus_per_node = 4\n", "gpus_per_node = 4\nnics = 0  # <-\n", 1),
        "nodes[0].nics",
        ">= 1",
    ),
}


def marked_line(text: str) -> int | None:
    return next((i for i, line in enumerate(text.splitlines(), start=1) if "# <-" in line), None)


@pytest.mark.parametrize(("text", "key", "message"), list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_port_faults_and_nodes_name_file_key_and_line(
    tmp_path: Path, text: str, key: str, message: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    err = info.value
    assert (err.file, err.key) == (str(path), key)
    assert message in err.message
    assert err.line == marked_line(text)


def test_a_live_cluster_counts_at_the_real_rate() -> None:
    """Served at ``speed`` x real time, counters grow by rate x real seconds (``counter_scale = 1/speed``)."""
    scenario = parse_scenario(BASE, source="test.toml")
    plain, live = SimCluster(scenario), SimCluster(scenario, counter_scale=0.1)
    t0, t1 = at(scenario, 5), at(scenario, 5) + STEP
    for sim, scale in ((plain, 1.0), (live, 0.1)):
        a, b = sim.snapshot("node-00", t0), sim.snapshot("node-00", t1)
        sent = num(b.nics[0].transmit_bytes_total) - num(a.nics[0].transmit_bytes_total)
        assert sent == pytest.approx(num(b.nics[0].transmit_bytes_per_second) * STEP * scale, abs=4.0)
        cpu_a, cpu_b = a.job_hosts[0], b.job_hosts[0]
        used = num(cpu_b.cpu_seconds_total) - num(cpu_a.cpu_seconds_total)
        assert used == pytest.approx(num(cpu_b.cpu_used_cores) * STEP * scale, abs=0.05)
    assert (
        plain.snapshot("node-00", t1).nics[0].transmit_bytes_per_second
        == live.snapshot("node-00", t1).nics[0].transmit_bytes_per_second
    )


def test_a_single_node_job_writes_its_checkpoints_over_the_ports_and_nothing_else() -> None:
    sim = cluster("", BASE.replace("memory_fraction = 0.6", 'memory_fraction = 0.6\ncheckpoint_every = "10m"'))
    s = sim.scenario
    busy = 0
    for t in steps(s, 2, 25):
        snap = sim.snapshot("node-02", t)
        small = [g for g in snap.gpus if g.gpu >= 4]
        sending = [p for p in snap.nics if num(p.transmit_bytes_per_second) > 0]
        assert {p.device for p in sending} <= {"mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"}  # next to its GPUs
        if sending:
            busy += 1
            assert max(num(g.utilization_ratio) for g in small) < 0.1  # the GPUs idle meanwhile
    assert 2 <= busy <= 6  # two checkpoints of 1-3 steps
