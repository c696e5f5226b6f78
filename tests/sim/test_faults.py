"""Each fault kind shows its docs/domain.md signature on exactly its target, from `at` for `duration`, nowhere else."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from gpulens.exporter.sim import CATALOGUE, SimCluster
from gpulens.model import THROTTLE_REASONS, NodeUnavailableError
from tests.sim.support import (
    BASE,
    SMALL_GPUS,
    STEP,
    TRAIN_GPUS,
    assert_only_target_changed,
    at,
    cluster,
    median,
    num,
    reading,
    readings,
    steps,
)

BIT = dict(THROTTLE_REASONS)
H100 = CATALOGUE["H100-SXM5-80GB"]
L40S = CATALOGUE["L40S"]
NVLINK_MAX = H100.nvlink_max_bytes_per_second
PCIE_MAX_H100 = H100.pcie_max_bytes_per_second


@pytest.fixture(scope="module")
def base() -> SimCluster:
    return cluster()


def fault(kind: str, target: str, start: str, duration: str | None = None, extra: str = "") -> str:
    lines = ["[[faults]]", f'kind = "{kind}"', target, f'at = "{start}"']
    if duration is not None:
        lines.append(f'duration = "{duration}"')
    return "\n" + "\n".join(lines) + "\n" + extra


def test_comm_stall(base: SimCluster) -> None:
    sim = cluster(fault("comm_stall", 'job = "train"', "20m", "10m"))
    s = sim.scenario
    before = [readings(sim, TRAIN_GPUS, t) for t in steps(s, 17, 20)]
    baseline_nvlink = median(r.nvlink_tx_bytes_per_second for rs in before for r in rs)
    baseline_pcie = median(r.pcie_tx_bytes_per_second for rs in before for r in rs)
    assert baseline_nvlink > 0.1 * NVLINK_MAX  # the job communicated before the stall
    memory = {g: reading(sim, *g, at(s, 20)).memory_used_bytes for g in TRAIN_GPUS}
    for t in steps(s, 20, 30):
        for r in readings(sim, TRAIN_GPUS, t):
            assert num(r.utilization_ratio) >= 0.98
            assert num(r.nvlink_tx_bytes_per_second) < 0.01 * baseline_nvlink
            assert num(r.nvlink_rx_bytes_per_second) < 0.01 * baseline_nvlink
            assert num(r.pcie_tx_bytes_per_second) < 0.01 * baseline_pcie
            assert num(r.power_watts) < 0.3 * H100.board_power_watts
            assert num(r.sm_active_ratio) < 0.1
            assert num(r.tensor_active_ratio) < 0.05
            assert r.memory_used_bytes == memory[(r.node, r.gpu)]  # exactly flat
            assert not r.xid_errors
            assert not r.throttle_reasons  # clocks stay up, nothing throttles
    assert_only_target_changed(base, sim, TRAIN_GPUS, 20, 30)


def test_hang_spinning_is_the_comm_stall_under_its_signature_name() -> None:
    spinning = cluster(fault("hang_spinning", 'job = "train"', "20m", "10m"))
    stall = cluster(fault("comm_stall", 'job = "train"', "20m", "10m"))
    s = spinning.scenario
    for t in steps(s, 18, 32):
        assert readings(spinning, TRAIN_GPUS, t) == readings(stall, TRAIN_GPUS, t)


def test_spinning_power_is_about_idle_power() -> None:
    """Measured on an H200: 123 W spinning against 122 W idle after load (docs/domain.md §7)."""
    sim = cluster(fault("hang_spinning", 'job = "train"', "20m", "10m"))
    for t in steps(sim.scenario, 20, 30):
        for r in readings(sim, TRAIN_GPUS, t):
            assert num(r.power_watts) < H100.idle_power_watts + 0.05 * (H100.board_power_watts - H100.idle_power_watts)
            assert num(r.utilization_ratio) >= 0.98


def test_hang_blocked(base: SimCluster) -> None:
    sim = cluster(fault("hang_blocked", 'job = "train"', "20m", "10m"))
    s = sim.scenario
    memory = {g: reading(sim, *g, at(s, 20)).memory_used_bytes for g in TRAIN_GPUS}
    assert all(num(m) > 0.8 * H100.memory_total_bytes for m in memory.values())  # the job's memory, held
    for t in steps(s, 20, 30):
        for r in readings(sim, TRAIN_GPUS, t):
            assert num(r.utilization_ratio) <= 0.02
            assert num(r.nvlink_tx_bytes_per_second) == 0.0
            assert num(r.pcie_tx_bytes_per_second) < 1e7
            assert num(r.power_watts) < H100.idle_power_watts + 0.03 * (H100.board_power_watts - H100.idle_power_watts)
            assert num(r.sm_active_ratio) == 0.0
            assert num(r.throttle_reasons) & BIT["idle"]
            assert r.memory_used_bytes == memory[(r.node, r.gpu)]  # exactly flat
            assert not r.xid_errors
    assert_only_target_changed(base, sim, TRAIN_GPUS, 20, 30)


def test_hang_mixed(base: SimCluster) -> None:
    ranks = 'ranks = ["node-00:0-3", "node-01:7"]\n'
    sim = cluster(fault("hang_mixed", 'job = "train"', "20m", "10m", extra=ranks))
    s = sim.scenario
    idle = {("node-00", i) for i in range(4)} | {("node-01", 7)}
    memory = {g: reading(sim, *g, at(s, 20)).memory_used_bytes for g in TRAIN_GPUS}
    for t in steps(s, 20, 30):
        for r in readings(sim, TRAIN_GPUS, t):
            if (r.node, r.gpu) in idle:
                assert num(r.utilization_ratio) <= 0.02
                assert num(r.throttle_reasons) & BIT["idle"]
            else:
                assert num(r.utilization_ratio) >= 0.98
                assert not r.throttle_reasons
            assert num(r.nvlink_tx_bytes_per_second) < 1e9
            assert num(r.power_watts) < 0.15 * H100.board_power_watts
            assert r.memory_used_bytes == memory[(r.node, r.gpu)]
    assert_only_target_changed(base, sim, TRAIN_GPUS, 20, 30)


def test_straggler(base: SimCluster) -> None:
    sim = cluster(fault("straggler", 'gpu = "node-01:3"', "10m", "10m"))
    s = sim.scenario
    peers = TRAIN_GPUS - {("node-01", 3)}
    # The fault-free run over the same window (the median over time skips its data-loader pauses).
    healthy = [readings(base, peers, t) for t in steps(s, 10, 20)]
    healthy_power = median(median(r.power_watts for r in rs) for rs in healthy)
    healthy_tensor = median(median(r.tensor_active_ratio for r in rs) for rs in healthy)
    for t in steps(s, 10, 20):
        slow = reading(sim, "node-01", 3, t)
        others = readings(sim, peers, t)
        assert num(slow.sm_clock_hertz) <= 0.75 * H100.max_sm_clock_hertz
        assert num(slow.throttle_reasons) & BIT["sw_thermal"]
        assert slow.temperature_celsius is not None
        assert slow.temperature_celsius < H100.slowdown_temperature_celsius
        peer_power = median(r.power_watts for r in others)
        assert abs(num(slow.power_watts) - peer_power) > 0.1 * peer_power
        assert peer_power < 0.9 * healthy_power
        assert median(r.tensor_active_ratio for r in others) < 0.8 * healthy_tensor
        assert all(r.throttle_reasons == 0 for r in others)
        assert all(r.sm_clock_hertz and r.sm_clock_hertz > 0.95 * H100.max_sm_clock_hertz for r in others)
    assert_only_target_changed(base, sim, TRAIN_GPUS, 10, 20)


def test_memory_leak(base: SimCluster) -> None:
    sim = cluster(fault("memory_leak", 'gpu = "node-02:0"', "10m", "20m"))
    s = sim.scenario
    used = [reading(sim, "node-02", 0, t).memory_used_bytes for t in steps(s, 10, 30)]
    assert all(u is not None for u in used)
    assert used == sorted(used)  # climbs
    last = reading(sim, "node-02", 0, at(s, 30) - STEP)
    assert num(last.memory_used_bytes) >= 0.97 * num(last.memory_total_bytes)
    assert used[0] < 0.95 * last.memory_total_bytes  # it started from the job's level
    process = next(p for p in sim.snapshot("node-02", at(s, 30) - STEP).processes if p.gpu == 0)
    assert num(process.memory_used_bytes) >= 0.95 * last.memory_total_bytes
    assert_only_target_changed(base, sim, {("node-02", 0)}, 10, 30)


def test_thermal_throttle(base: SimCluster) -> None:
    sim = cluster(fault("thermal_throttle", 'gpu = "node-02:1"', "5m", "10m"))
    s = sim.scenario
    for t in steps(s, 5, 15):
        r = reading(sim, "node-02", 1, t)
        assert num(r.temperature_celsius) >= num(r.slowdown_temperature_celsius)
        assert r.throttle_reasons is not None
        assert r.throttle_reasons & BIT["sw_thermal"]
        assert r.throttle_reasons & BIT["hw_thermal"]
        assert num(r.sm_clock_hertz) < 0.6 * H100.max_sm_clock_hertz
    assert_only_target_changed(base, sim, {("node-02", 1)}, 5, 15)


def test_power_cap(base: SimCluster) -> None:
    sim = cluster(fault("power_cap", 'gpu = "node-02:0"', "5m", "10m"))
    s = sim.scenario
    for t in steps(s, 5, 15):
        r = reading(sim, "node-02", 0, t)
        assert num(r.power_limit_watts) < H100.board_power_watts
        assert 0.98 * r.power_limit_watts <= num(r.power_watts) <= r.power_limit_watts
        assert num(r.throttle_reasons) & BIT["sw_power_cap"]
    assert_only_target_changed(base, sim, {("node-02", 0)}, 5, 15)


def test_pcie_degraded(base: SimCluster) -> None:
    sim = cluster(fault("pcie_degraded", 'gpu = "node-03:0"', "10m", "20m"))
    s = sim.scenario
    for t in steps(s, 10, 30):
        r = reading(sim, "node-03", 0, t)
        assert num(r.pcie_link_generation) < num(r.pcie_link_generation_max)
        assert num(r.pcie_link_width) < num(r.pcie_link_width_max)
    healthy = reading(sim, "node-03", 0, at(s, 30))
    assert (healthy.pcie_link_generation, healthy.pcie_link_width) == (L40S.pcie_generation, L40S.pcie_width)
    assert_only_target_changed(base, sim, {("node-03", 0)}, 10, 30)


def test_nvlink_errors(base: SimCluster) -> None:
    sim = cluster(fault("nvlink_errors", 'gpu = "node-01:5"', "30m", "5m"))
    s = sim.scenario
    times = [*steps(s, 30, 35), at(s, 35)]
    crc = [num(reading(sim, "node-01", 5, t).nvlink_crc_flit_errors_total) for t in times]
    assert crc[0] == reading(base, "node-01", 5, times[0]).nvlink_crc_flit_errors_total
    for earlier, later in itertools.pairwise(crc):
        assert (later - earlier) / STEP > 100
    replays = [num(reading(sim, "node-01", 5, t).nvlink_replay_errors_total) for t in (times[0], times[-1])]
    assert replays[1] > replays[0]
    after = [reading(sim, "node-01", 5, t).nvlink_crc_flit_errors_total for t in (at(s, 36), at(s, 50))]
    assert after == [crc[-1], crc[-1]]  # stops climbing when the window ends
    assert_only_target_changed(base, sim, {("node-01", 5)}, 30, 35)


def test_xid(base: SimCluster) -> None:
    sim = cluster(fault("xid", 'gpu = "node-00:2"', "12m", extra="xid = 79\n"))
    s = sim.scenario
    assert reading(sim, "node-00", 2, at(s, 12) - STEP).xid_errors == {}
    for t in (at(s, 12), at(s, 30), at(s, 59)):
        assert reading(sim, "node-00", 2, t).xid_errors == {79: 1}
    assert_only_target_changed(base, sim, {("node-00", 2)}, 12, 60)


def test_xid_writes_the_drivers_line_so_a_gpu_lost_at_once_still_counts_it(base: SimCluster) -> None:
    sim = cluster(
        fault("xid", 'gpu = "node-02:5"', "15m", extra="xid = 79\n") + fault("gpu_lost", 'gpu = "node-02:5"', "15m")
    )
    s = sim.scenario
    lost = reading(sim, "node-02", 5, at(s, 16))
    assert (lost.up, lost.xid_errors) == (False, {79: 1})  # NVML lost it: the kernel log's line counts
    assert reading(sim, "node-02", 5, at(s, 15) - STEP).xid_errors == {}
    lines = sim._kernel["node-02"].lines
    assert [line for _, line in lines] == [
        "[ 1500.000000] NVRM: Xid (PCI:0000:ab:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    ]
    view = sim.snapshot("node-02", at(s, 16)).kernel
    assert view is not None
    assert [(a.xid, a.action) for a in view.actions] == [(79, "reboot")]


def test_kernel_xid(base: SimCluster) -> None:
    sim = cluster(fault("kernel_xid", 'gpu = "node-00:3"', "12m", extra="xid = 48\n"))
    s = sim.scenario
    assert reading(sim, "node-00", 3, at(s, 12) - STEP).xid_errors == {}
    for t in (at(s, 12), at(s, 59)):
        assert reading(sim, "node-00", 3, t).xid_errors == {48: 1}  # from the kernel log alone
    assert sim._kernel["node-00"].counts(at(s, 12))[0] == {"0000:5d:00": {48: 1}}
    assert_only_target_changed(base, sim, {("node-00", 3)}, 12, 60)


def test_sxid(base: SimCluster) -> None:
    sim = cluster(fault("sxid", 'node = "node-01"', "20m", extra="sxid = 24007\nswitch = 2\n"))
    s = sim.scenario
    assert sim.snapshot("node-01", at(s, 20) - STEP).kernel is None
    view = sim.snapshot("node-01", at(s, 21)).kernel
    assert view is not None
    assert view.sxids == (("0000:07:00.0", 24007, 1),)  # three lines, one event
    assert len(sim._kernel["node-01"].lines) == 3
    assert sim.snapshot("node-00", at(s, 21)).kernel is None
    assert_only_target_changed(base, sim, set(), 20, 60)  # no GPU reading changes


def test_gpu_lost(base: SimCluster) -> None:
    sim = cluster(fault("gpu_lost", 'gpu = "node-02:5"', "15m", "5m"))
    s = sim.scenario
    identity = {"node", "gpu", "uuid", "model", "timestamp", "up", "pci_bus_id", "xid_errors"}
    for t in steps(s, 15, 20):
        snap = sim.snapshot("node-02", t)
        lost = snap.gpus[5]
        assert lost.up is False
        assert lost.uuid == reading(base, "node-02", 5, t).uuid
        for f in dataclasses.fields(lost):
            if f.name not in identity:
                assert getattr(lost, f.name) is None, f.name
        assert not [x for x in snap.links if x.gpu == 5]
        assert not [p for p in snap.processes if p.gpu == 5]
        assert [j.job_id for j in snap.jobs if j.gpu == 5] == ["small"]  # still allocated
    assert reading(sim, "node-02", 5, at(s, 20)).up is True
    assert_only_target_changed(base, sim, {("node-02", 5)}, 15, 20)


def test_idle_allocated(base: SimCluster) -> None:
    sim = cluster(fault("idle_allocated", 'job = "serve2"', "10m", "15m"))
    s = sim.scenario
    held = reading(base, "node-02", 1, at(s, 9)).memory_used_bytes
    for t in steps(s, 10, 25):
        snap = sim.snapshot("node-02", t)
        r = snap.gpus[1]
        assert num(r.utilization_ratio) <= 0.02
        assert num(r.throttle_reasons) & BIT["idle"]
        assert r.memory_used_bytes == held
        assert [j.job_id for j in snap.jobs if j.gpu == 1] == ["serve2"]
    assert_only_target_changed(base, sim, {("node-02", 1)}, 10, 25)


def test_exporter_down(base: SimCluster) -> None:
    sim = cluster(fault("exporter_down", 'node = "node-02"', "10m", "5m"))
    s = sim.scenario
    for t in steps(s, 10, 15):
        with pytest.raises(NodeUnavailableError):
            sim.snapshot("node-02", t)
        for node in ("node-00", "node-01", "node-03"):
            assert sim.snapshot(node, t) == base.snapshot(node, t)
    for t in (at(s, 10) - STEP, at(s, 15), at(s, 40)):
        assert sim.snapshot("node-02", t) == base.snapshot("node-02", t)


def test_nvml_hang(base: SimCluster) -> None:
    sim = cluster(fault("nvml_hang", 'node = "node-02"', "10m", "5m"))
    s = sim.scenario
    for t in steps(s, 10, 15):
        snap = sim.snapshot("node-02", t)
        healthy = base.snapshot("node-02", t)
        # The node answers: its GPU readings withdrawn and marked stale since the hang, its jobs and host read on.
        assert (snap.gpus, snap.links, snap.processes) == ((), (), ())
        assert snap.nvml_hung_since == at(s, 10)
        assert snap.stale == {"gpus": t - at(s, 10)}
        assert (snap.jobs, snap.host, snap.nics) == (healthy.jobs, healthy.host, healthy.nics)
        for node in ("node-00", "node-01", "node-03"):
            assert sim.snapshot(node, t) == base.snapshot(node, t)
    for t in (at(s, 10) - STEP, at(s, 15), at(s, 40)):
        assert sim.snapshot("node-02", t) == base.snapshot("node-02", t)


def test_pcie_saturation(base: SimCluster) -> None:
    sim = cluster(fault("pcie_saturation", 'gpu = "node-02:1"', "20m", "5m"))
    s = sim.scenario
    assert (reading(base, "node-02", 1, at(s, 20)).pcie_tx_bytes_per_second or 0) < 0.1 * PCIE_MAX_H100
    for t in steps(s, 20, 25):
        r = reading(sim, "node-02", 1, t)
        assert 0.85 * PCIE_MAX_H100 <= num(r.pcie_tx_bytes_per_second) <= PCIE_MAX_H100
        assert 0.85 * PCIE_MAX_H100 <= num(r.pcie_rx_bytes_per_second) <= PCIE_MAX_H100
    assert_only_target_changed(base, sim, {("node-02", 1)}, 20, 25)


def test_nvlink_saturation(base: SimCluster) -> None:
    sim = cluster(fault("nvlink_saturation", 'job = "small"', "30m", "10m"))
    s = sim.scenario
    assert median(r.nvlink_tx_bytes_per_second for r in readings(base, SMALL_GPUS, at(s, 30))) < 0.5 * NVLINK_MAX
    for t in steps(s, 30, 40):
        for r in readings(sim, SMALL_GPUS, t):
            assert 0.9 * NVLINK_MAX <= num(r.nvlink_tx_bytes_per_second) <= NVLINK_MAX
            assert 0.9 * NVLINK_MAX <= num(r.nvlink_rx_bytes_per_second) <= NVLINK_MAX
            assert num(r.utilization_ratio) >= 0.9
        links = [x for x in sim.snapshot("node-02", t).links if x.gpu == 4]
        assert len(links) == H100.nvlink_links
        assert sum(x.tx_bytes_per_second or 0 for x in links) >= 0.9 * NVLINK_MAX
    assert_only_target_changed(base, sim, SMALL_GPUS, 30, 40)


def test_dead_profiling_reads_zero_while_everything_else_runs(base: SimCluster) -> None:
    sim = cluster(fault("dead_profiling", 'node = "node-01"', "25m", "20m"))
    s = sim.scenario
    node_gpus = {("node-01", i) for i in range(8)}
    for t in steps(s, 25, 45):
        for got, want in zip(readings(sim, node_gpus, t), readings(base, node_gpus, t), strict=True):
            assert (got.sm_active_ratio, got.tensor_active_ratio, got.dram_active_ratio) == (0.0, 0.0, 0.0)
            # Utilization, traffic, power, clocks: exactly what the healthy run reads.
            assert got == dataclasses.replace(want, sm_active_ratio=0.0, tensor_active_ratio=0.0, dram_active_ratio=0.0)
    assert_only_target_changed(base, sim, node_gpus, 25, 45)


def test_fault_defaults_to_the_end_of_its_job_or_the_scenario() -> None:
    short_job = BASE.replace("memory_fraction = 0.6\n", 'memory_fraction = 0.6\nend = "40m"\n')
    text = fault("comm_stall", 'job = "small"', "10m") + fault("thermal_throttle", 'gpu = "node-02:2"', "50m")
    sim = cluster(text, base=short_job)
    stall, throttle = sim.scenario.faults
    assert stall.end == at(sim.scenario, 40)
    assert throttle.end == at(sim.scenario, 60)


def test_rank_dead_frees_its_gpu_and_ras_loses_its_process() -> None:
    sim = cluster(fault("rank_dead", 'gpu = "node-01:5"', "20m", "10m"))
    s = sim.scenario
    for t in steps(s, 21, 30):
        dead = reading(sim, "node-01", 5, t)
        assert num(dead.utilization_ratio) <= 0.02
        assert num(dead.memory_used_bytes) < 0.05 * H100.memory_total_bytes  # its memory freed
        others = readings(sim, TRAIN_GPUS - {("node-01", 5)}, t)
        assert all(num(r.utilization_ratio) >= 0.98 for r in others)  # the others spin
    states = {}
    for minutes in (20.0 + 3 / 60, 20.5, 21.5):
        t = at(s, minutes)
        view = sim.snapshot("node-01", t).nccl
        sim.snapshot("node-00", t)
        assert view is not None
        states[minutes] = next(r.state for r in view.ranks if r.gpu == 5)
    assert states[20.5] == "unresponsive"
    assert states[21.5] == "dead"


def test_stuck_ranks_stay_one_operation_behind_in_ras() -> None:
    sim = cluster(fault("hang_spinning", 'job = "train"', "20m", "10m", 'stuck_ranks = ["node-00:2"]\n'))
    s = sim.scenario
    lags = []
    for t in steps(s, 21, 25):
        view = sim.snapshot("node-00", t).nccl
        sim.snapshot("node-01", t)
        assert view is not None
        lags.append({r.rank: r.lag for r in view.ranks if r.lag})
    assert lags[-1] == {2: 1}
    assert all(lag in ({2: 1}, {}) for lag in lags)


def test_stuck_ranks_over_the_ras_protocol_on_a_real_port() -> None:
    """A live exporter's simulated node serves its RAS on 127.0.0.1: the agent's client reads it over TCP."""
    from gpulens.exporter.sim import parse_scenario

    text = BASE + fault("hang_spinning", 'job = "train"', "20m", "10m", 'stuck_ranks = ["node-00:2"]\n')
    sim = SimCluster(parse_scenario(text, source="tcp"), ras_over_tcp=True)
    try:
        s = sim.scenario
        views = []
        for t in steps(s, 21, 24):
            views.append(sim.snapshot("node-00", t).nccl)
            sim.snapshot("node-01", t)
    finally:
        sim.close()
    last = views[-1]
    assert last is not None
    assert last.up
    assert {r.rank: r.lag for r in last.ranks if r.lag} == {2: 1}
    assert sum(sim.nccl.queries.values()) >= 2
