"""Healthy behaviour and the confounders of docs/domain.md: they look real and carry no fault signature."""

from __future__ import annotations

import dataclasses

import pytest

from gpulens.exporter.sim import CATALOGUE, SimCluster
from gpulens.model import THROTTLE_REASONS
from tests.sim.support import BASE, SMALL_GPUS, STEP, TRAIN_GPUS, at, cluster, median, num, reading, readings, steps

BIT = dict(THROTTLE_REASONS)
H100 = CATALOGUE["H100-SXM5-80GB"]
L40S = CATALOGUE["L40S"]


# Read from dcgm-exporter pages only (not simulated): DCGM's violation counters, persistent ECC counts, page
# retirement (before Ampere: an H100 remaps rows instead), dcgm-exporter's health and P2P status, the FP pipes.
DCGM_EXPORTER_ONLY = {
    *(f"{p}_violation_seconds_total" for p in ("power", "thermal", "sync_boost", "board_limit", "low_utilization")),
    *("reliability_violation_seconds_total", "ecc_corrected_errors_persistent_total"),
    *("ecc_uncorrected_errors_persistent_total", "retired_pages_single_bit_total", "retired_pages_double_bit_total"),
    *("retired_pages_pending", "nvlink_crc_data_errors_total", "health_status", "p2p_peers_ok"),
    *("sm_occupancy_ratio", "fp64_active_ratio", "fp32_active_ratio", "fp16_active_ratio"),
}


@pytest.fixture(scope="module")
def sim() -> SimCluster:
    return cluster()


def job_utilization(sim: SimCluster, gpus: frozenset[tuple[str, int]], t: float) -> list[float]:
    return [r.utilization_ratio or 0.0 for r in readings(sim, gpus, t)]


def test_every_reading_field_is_filled_like_an_h100(sim: SimCluster) -> None:
    r = reading(sim, "node-00", 0, at(sim.scenario, 5))
    for f in dataclasses.fields(r):  # an H100 reads every field but those only a dcgm-exporter page gives
        assert (getattr(r, f.name) is not None) == (f.name not in DCGM_EXPORTER_ONLY), f.name
    assert r.model == H100.product_name
    assert r.memory_total_bytes == H100.memory_total_bytes
    assert r.power_limit_watts == H100.board_power_watts
    assert r.slowdown_temperature_celsius == H100.slowdown_temperature_celsius
    assert r.max_sm_clock_hertz == H100.max_sm_clock_hertz
    assert r.nvlink_links_active == H100.nvlink_links
    assert (r.pcie_link_generation, r.pcie_link_width) == (5, 16)
    assert r.uuid.startswith("GPU-")
    assert len(r.uuid) == 40
    snap = sim.snapshot("node-00", at(sim.scenario, 5))
    assert snap.source == "sim"
    assert len([x for x in snap.links if x.gpu == 0]) == H100.nvlink_links
    assert [(p.command, p.user, p.job_id) for p in snap.processes if p.gpu == 0] == [("python", "alice", "train")]
    assert [(j.job_id, j.user) for j in snap.jobs if j.gpu == 0] == [("train", "alice")]


def test_training_communicates_over_nvlink_and_across_nodes_over_pcie(sim: SimCluster) -> None:
    s = sim.scenario
    nvlink_max = H100.nvlink_max_bytes_per_second
    pcie = {}
    for job in (TRAIN_GPUS, SMALL_GPUS):
        run_steps = [t for t in steps(s, 1, 14) if min(job_utilization(sim, job, t)) > 0.5]  # skip data pauses
        assert len(run_steps) > 60
        for t in run_steps:
            for r in readings(sim, job, t):
                assert 0.9 <= num(r.utilization_ratio) <= 1.0
                assert num(r.nvlink_tx_bytes_per_second) > 0.1 * nvlink_max
                assert num(r.power_watts) > 0.6 * H100.board_power_watts
                assert num(r.tensor_active_ratio) > 0.3
                assert r.throttle_reasons == 0
        pcie[job] = median(r.pcie_tx_bytes_per_second for t in run_steps for r in readings(sim, job, t))
    assert pcie[TRAIN_GPUS] > 3 * pcie[SMALL_GPUS]  # the two-node job all-reduces across nodes over PCIe


def test_a_short_step_shows_the_compute_and_all_reduce_phases() -> None:
    text = """
[cluster]
nodes = 1
step = "1s"
duration = "2m"
seed = 3
[[jobs]]
id = "t"
user = "u"
kind = "training"
gpus = ["node-00"]
"""
    sim = cluster(base=text)
    rates = [reading(sim, "node-00", 0, sim.scenario.start + i).nvlink_tx_bytes_per_second or 0.0 for i in range(60)]
    nvlink_max = H100.nvlink_max_bytes_per_second
    assert max(rates) > 0.5 * nvlink_max  # all-reduce bursts
    assert min(rates) < 0.1 * nvlink_max  # compute phases in between


def test_single_gpu_inference_at_full_utilization_without_nvlink(sim: SimCluster) -> None:
    for t in steps(sim.scenario, 0, 60):
        snap = sim.snapshot("node-02", t)
        r = snap.gpus[0]
        assert num(r.utilization_ratio) >= 0.8
        assert (r.nvlink_tx_bytes_per_second, r.nvlink_rx_bytes_per_second) == (0.0, 0.0)
        assert num(r.power_watts) > 0.5 * H100.board_power_watts
        assert num(r.tensor_active_ratio) > 0.3
        assert num(r.sm_active_ratio) > 0.5
        assert r.throttle_reasons == 0
        assert [p.command for p in snap.processes if p.gpu == 0] == ["vllm"]


def test_data_loader_pauses_hit_all_ranks_together_for_one_step(sim: SimCluster) -> None:
    s = sim.scenario
    pauses = [t for t in steps(s, 1, 14) if max(job_utilization(sim, TRAIN_GPUS, t)) < 0.2]
    assert pauses, "a 13-minute training run has data-loader pauses"
    for t in pauses:
        assert min(job_utilization(sim, TRAIN_GPUS, t + STEP)) > 0.9  # back to work the next step
        rs = readings(sim, TRAIN_GPUS, t)
        assert all(r.nvlink_tx_bytes_per_second is not None and r.nvlink_tx_bytes_per_second < 1e9 for r in rs)
        assert all(r.throttle_reasons == 0 for r in rs)  # nothing throttles, no fault bit
        assert all(r.power_watts is not None and r.power_watts < 0.4 * H100.board_power_watts for r in rs)
        # other jobs carry on
        assert (reading(sim, "node-02", 4, t).utilization_ratio or 0.0) > 0.9
    busy = [t for t in steps(s, 1, 14) if min(job_utilization(sim, TRAIN_GPUS, t)) > 0.9]
    assert len(pauses) < 0.15 * len(busy)  # brief and rare
    mixed = [
        t
        for t in steps(s, 1, 60)
        if min(job_utilization(sim, TRAIN_GPUS, t)) < 0.2 < max(job_utilization(sim, TRAIN_GPUS, t))
    ]
    assert not mixed  # a pause is never on some ranks only


def test_checkpoints_pause_every_rank_with_a_pcie_burst(sim: SimCluster) -> None:
    s = sim.scenario
    pcie_max = H100.pcie_max_bytes_per_second
    for checkpoint_min in (15, 30, 45):
        paused = [
            t for t in steps(s, checkpoint_min, checkpoint_min + 1) if max(job_utilization(sim, TRAIN_GPUS, t)) < 0.1
        ]
        assert 1 <= len(paused) <= 3
        assert paused[0] == at(s, checkpoint_min)
        for t in paused:
            for r in readings(sim, TRAIN_GPUS, t):
                assert num(r.pcie_tx_bytes_per_second) > 0.3 * pcie_max
                assert num(r.memory_used_bytes) > 0.8 * H100.memory_total_bytes
        assert min(job_utilization(sim, TRAIN_GPUS, paused[-1] + STEP)) > 0.5


def phased(**fields: str) -> SimCluster:
    """The base scenario with the small job's training phases set (``node-02:4-7``)."""
    keys = "".join(f'{k} = "{v}"\n' for k, v in fields.items())
    return cluster(base=BASE.replace("memory_fraction = 0.6\n", "memory_fraction = 0.6\n" + keys))


def test_a_long_checkpoint_copies_then_idles_with_memory_held() -> None:
    sim = phased(checkpoint_every="20m", checkpoint_duration="15m")
    s = sim.scenario
    window = list(steps(s, 20, 35))
    burst = [t for t in window if median(r.pcie_tx_bytes_per_second for r in readings(sim, SMALL_GPUS, t)) > 1e10]
    assert 1 <= len(burst) <= 3  # the device-to-host copy
    assert burst[0] == at(s, 20)
    memory = {g: reading(sim, *g, at(s, 25)).memory_used_bytes for g in SMALL_GPUS}
    for t in window[len(burst) :]:  # the host writes it out
        for r in readings(sim, SMALL_GPUS, t):
            assert num(r.utilization_ratio) <= 0.02
            assert num(r.pcie_tx_bytes_per_second) < 1e8
            assert num(r.throttle_reasons) & BIT["idle"]
            assert r.memory_used_bytes == memory[(r.node, r.gpu)]
    assert min(job_utilization(sim, SMALL_GPUS, at(s, 35))) > 0.9  # back to work
    assert max(job_utilization(sim, SMALL_GPUS, at(s, 35) - STEP)) < 0.1


def test_evaluation_phases_lower_utilization_and_traffic_on_every_rank() -> None:
    sim = phased(eval_every="10m", eval_duration="3m")
    s = sim.scenario
    for start in (10, 20, 30):
        for t in steps(s, start, start + 3):
            rs = readings(sim, SMALL_GPUS, t)
            assert all(0.5 < num(r.utilization_ratio) < 0.75 for r in rs)
            assert all(num(r.nvlink_tx_bytes_per_second) < 0.01 * H100.nvlink_max_bytes_per_second for r in rs)
            assert all(num(r.power_watts) > 0.3 * H100.board_power_watts for r in rs)


def test_a_slow_first_step_is_mostly_idle_with_memory_growing() -> None:
    sim = phased(first_step="20m")
    s = sim.scenario
    window = list(steps(s, 0, 20))
    used = [median(r.memory_used_bytes for r in readings(sim, SMALL_GPUS, t)) for t in window]
    assert used[-1] > 5 * used[0]
    assert used[len(used) // 2] < used[-1]
    utilization = [max(job_utilization(sim, SMALL_GPUS, t)) for t in window]
    idle = [u for u in utilization if u < 0.05]
    assert len(idle) > 0.8 * len(utilization)  # mostly idle
    assert max(utilization) < 0.5  # warm-up bursts, no training yet
    assert all(num(r.nvlink_tx_bytes_per_second) == 0.0 for t in window for r in readings(sim, SMALL_GPUS, t))
    assert min(job_utilization(sim, SMALL_GPUS, at(s, 21))) > 0.9


def test_pcie_only_node_has_no_nvlink(sim: SimCluster) -> None:
    snap = sim.snapshot("node-03", at(sim.scenario, 10))
    assert not snap.links
    for r in snap.gpus:
        assert r.model == L40S.product_name
        assert r.nvlink_links_active == 0
        assert r.nvlink_tx_bytes_per_second is None
        assert r.nvlink_crc_flit_errors_total is None
        assert r.memory_temperature_celsius is None  # GDDR boards have no memory sensor
        assert r.power_limit_watts == L40S.board_power_watts
    serving = snap.gpus[0]
    assert num(serving.utilization_ratio) >= 0.8
    assert serving.throttle_reasons == 0


def test_training_on_a_pcie_only_node_all_reduces_over_pcie() -> None:
    text = """
[cluster]
nodes = 1
gpu_model = "L40S"
gpus_per_node = 4
[[jobs]]
id = "t"
user = "u"
kind = "training"
gpus = ["node-00"]
"""
    sim = cluster(base=text)
    r = reading(sim, "node-00", 0, at(sim.scenario, 5))
    assert r.nvlink_tx_bytes_per_second is None
    assert num(r.pcie_tx_bytes_per_second) > 0.05 * L40S.pcie_max_bytes_per_second


def test_free_and_idle_gpus_look_idle() -> None:
    text = """
[cluster]
nodes = 1
[[jobs]]
id = "held"
user = "u"
kind = "idle"
gpus = ["node-00:0"]
[[jobs]]
id = "nb"
user = "u"
kind = "notebook"
gpus = ["node-00:1"]
"""
    sim = cluster(base=text)
    s = sim.scenario
    free = reading(sim, "node-00", 7, at(s, 5))
    assert free.throttle_reasons == BIT["idle"]
    assert free.sm_clock_hertz == H100.idle_sm_clock_hertz
    assert num(free.power_watts) < 0.15 * H100.board_power_watts
    assert num(free.memory_used_bytes) < 0.01 * H100.memory_total_bytes
    held = sim.snapshot("node-00", at(s, 5))
    assert num(held.gpus[0].utilization_ratio) <= 0.02
    assert [j.job_id for j in held.jobs if j.gpu == 0] == ["held"]
    assert not [p for p in held.processes if p.gpu == 0]  # memory_fraction 0: no process
    notebook = [reading(sim, "node-00", 1, t).utilization_ratio or 0.0 for t in steps(s, 0, 60)]
    assert max(notebook) > 0.3  # bursty
    assert min(notebook) < 0.05


def test_notebooks_may_share_a_gpu() -> None:
    text = """
[cluster]
nodes = 1
[[jobs]]
id = "a"
user = "u"
kind = "notebook"
gpus = ["node-00:0"]
memory_fraction = 0.2
[[jobs]]
id = "b"
user = "v"
kind = "notebook"
gpus = ["node-00:0"]
memory_fraction = 0.3
"""
    sim = cluster(base=text)
    snap = sim.snapshot("node-00", at(sim.scenario, 5))
    assert sorted(j.job_id for j in snap.jobs) == ["a", "b"]
    assert sorted(p.job_id or "" for p in snap.processes) == ["a", "b"]
    used = snap.gpus[0].memory_used_bytes
    assert 0.49 * H100.memory_total_bytes < num(used) < 0.51 * H100.memory_total_bytes


def test_energy_counter_follows_power(sim: SimCluster) -> None:
    s = sim.scenario
    times = list(steps(s, 2, 12))
    energy = [reading(sim, "node-00", 0, t).energy_joules_total or 0.0 for t in times]
    power = [reading(sim, "node-00", 0, t).power_watts or 0.0 for t in times]
    assert energy == sorted(energy)
    average = sum(power[:-1]) / (len(power) - 1)
    rate = (energy[-1] - energy[0]) / (times[-1] - times[0])
    assert abs(rate - average) < 0.03 * average
    idle_rate = (reading(sim, "node-03", 3, at(s, 10)).energy_joules_total or 0.0) - (
        reading(sim, "node-03", 3, at(s, 5)).energy_joules_total or 0.0
    )
    assert 0 < idle_rate / 300 < 0.15 * L40S.board_power_watts


def test_readings_continue_after_the_scenario_ends(sim: SimCluster) -> None:
    s = sim.scenario
    late = s.end + 3600
    snap = sim.snapshot("node-00", late)
    assert snap.timestamp == late
    assert not snap.jobs
    assert not snap.processes
    assert all(r.utilization_ratio is not None and r.utilization_ratio <= 0.02 for r in snap.gpus)
    end_energy = reading(sim, "node-00", 0, s.end).energy_joules_total
    assert (snap.gpus[0].energy_joules_total or 0.0) > num(end_energy)


def test_a_hundred_node_scenario_builds_and_snapshots() -> None:
    jobs = "".join(
        f'[[jobs]]\nid = "job-{i}"\nuser = "u"\nkind = "training"\n'
        f'gpus = ["node-{2 * i:02d}", "node-{2 * i + 1:02d}"]\n'
        for i in range(40)
    )
    text = f'[cluster]\nnodes = 100\nduration = "2h"\n{jobs}'
    sim = cluster(base=text)
    names = sim.node_names()
    assert len(names) == 100
    assert (names[0], names[-1]) == ("node-00", "node-99")
    t = at(sim.scenario, 30)
    snaps = [sim.snapshot(name, t) for name in names]
    assert sum(len(s.gpus) for s in snaps) == 800
    busy = [r for s in snaps[:80] for r in s.gpus]
    assert median(r.utilization_ratio for r in busy) > 0.9
    assert all(r.throttle_reasons == BIT["idle"] for s in snaps[80:] for r in s.gpus)
