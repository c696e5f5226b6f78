"""Determinism: the same scenario, seed and virtual time give the same readings; another seed gives other noise."""

from __future__ import annotations

from pathlib import Path

from gpulens.exporter.sim import SimCluster, load_scenario, parse_scenario
from tests.sim.support import BASE, STEP, at, cluster


def test_same_scenario_and_seed_give_identical_snapshots_in_any_order() -> None:
    first, second = cluster(), cluster()
    s = first.scenario
    times = [at(s, m) for m in (0, 7, 15, 31, 59, 70)]
    forward = {(n, t): first.snapshot(n, t) for t in times for n in first.node_names()}
    backward = {(n, t): second.snapshot(n, t) for t in reversed(times) for n in reversed(second.node_names())}
    assert forward == backward


def test_any_time_inside_a_step_gives_that_steps_readings() -> None:
    sim = cluster()
    step_start = at(sim.scenario, 12)
    snap = sim.snapshot("node-00", step_start)
    for offset in (0.001, 4.2, STEP - 0.001):
        fresh = cluster().snapshot("node-00", step_start + offset)
        assert fresh == snap
        assert fresh.timestamp == step_start
        assert all(r.timestamp == step_start for r in fresh.gpus)
    assert sim.snapshot("node-00", step_start + STEP).timestamp == step_start + STEP


def test_another_seed_gives_other_noise_but_the_same_cluster() -> None:
    one = cluster()
    other = SimCluster(parse_scenario(BASE.replace("seed = 5", "seed = 6"), source="test.toml"))
    t = at(one.scenario, 8)
    a, b = one.snapshot("node-00", t), other.snapshot("node-00", t)
    assert [r.uuid for r in a.gpus] == [r.uuid for r in b.gpus]  # same hardware
    assert [p.job_id for p in a.processes] == [p.job_id for p in b.processes]  # same jobs
    assert [r.power_watts for r in a.gpus] != [r.power_watts for r in b.gpus]
    assert [r.pcie_tx_bytes_per_second for r in a.gpus] != [r.pcie_tx_bytes_per_second for r in b.gpus]


def test_readings_carry_noise_from_step_to_step_and_gpu_to_gpu() -> None:
    sim = cluster()
    s = sim.scenario
    inference = [sim.snapshot("node-02", at(s, 5) + k * STEP).gpus[0] for k in range(6)]
    assert len({r.power_watts for r in inference}) == 6
    assert len({r.temperature_celsius for r in inference} | {r.utilization_ratio for r in inference}) > 1
    ranks = sim.snapshot("node-00", at(s, 5)).gpus
    assert len({r.power_watts for r in ranks}) == len(ranks)
    assert len({r.nvlink_tx_bytes_per_second for r in ranks}) == len(ranks)


def test_ports_hosts_and_fabric_faults_are_reproducible_in_any_order() -> None:
    path = Path(__file__).parents[2] / "examples" / "scenarios" / "fabric.toml"
    first, second = SimCluster(load_scenario(path)), SimCluster(load_scenario(path))
    s = first.scenario
    times = [at(s, m) for m in (0, 9, 21, 27, 44, 55, 59)]
    forward = {(n, t): first.snapshot(n, t) for t in times for n in first.node_names()}
    backward = {(n, t): second.snapshot(n, t) for t in reversed(times) for n in reversed(second.node_names())}
    assert forward == backward
    assert all(snap.nics and snap.host is not None for snap in forward.values())
