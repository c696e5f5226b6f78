"""A base scenario for the simulator's tests, and helpers to read it back step by step."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Iterator

from gpulens.exporter.sim import Scenario, SimCluster, parse_scenario
from gpulens.model import GpuReading, NodeSnapshot, NodeUnavailableError

STEP = 10.0
MINUTE = 60.0

# Three H100 nodes and a PCIe-only L40S node. node-00/01 hold a 16-GPU training job that checkpoints every
# 15 minutes; node-02 holds two single-GPU inference jobs, a 4-GPU single-node training job and a free GPU;
# node-03 serves inference on L40S GPUs 0-1 and leaves 2-3 free.
BASE = """
[cluster]
nodes = 4
gpus_per_node = 8
gpu_model = "H100-SXM5-80GB"
seed = 5
start = "2026-01-01T00:00:00Z"
duration = "60m"
step = "10s"

[[nodes]]
name = "node-03"
gpu_model = "L40S"
gpus_per_node = 4

[[jobs]]
id = "train"
user = "alice"
kind = "training"
gpus = ["node-00:0-7", "node-01:0-7"]
checkpoint_every = "15m"

[[jobs]]
id = "serve"
user = "svc"
kind = "inference"
gpus = ["node-02:0"]

[[jobs]]
id = "serve2"
user = "svc"
kind = "inference"
gpus = ["node-02:1"]

[[jobs]]
id = "small"
user = "bob"
kind = "training"
gpus = ["node-02:4-7"]
memory_fraction = 0.6

[[jobs]]
id = "l40s"
user = "svc"
kind = "inference"
gpus = ["node-03:0-1"]
"""

TRAIN_GPUS = frozenset([("node-00", i) for i in range(8)] + [("node-01", i) for i in range(8)])
SMALL_GPUS = frozenset(("node-02", i) for i in range(4, 8))

# Fields that accumulate: after a fault's window they keep what the fault added.
CUMULATIVE = (
    "energy_joules_total",
    "nvlink_crc_flit_errors_total",
    "nvlink_replay_errors_total",
    "nvlink_recovery_errors_total",
    "pcie_replays_total",
    "xid_errors",
)


def cluster(extra: str = "", base: str = BASE) -> SimCluster:
    return SimCluster(parse_scenario(base + extra, source="test.toml"))


def at(scenario: Scenario, minutes: float) -> float:
    return scenario.start + minutes * MINUTE


def steps(scenario: Scenario, start_min: float, end_min: float) -> Iterator[float]:
    """Every step's time from ``start_min`` (inclusive) to ``end_min`` (exclusive)."""
    k = round(start_min * MINUTE / STEP)
    while k * STEP < end_min * MINUTE - 1e-9:
        yield scenario.start + k * STEP
        k += 1


def reading(sim: SimCluster, node: str, gpu: int, t: float) -> GpuReading:
    return sim.snapshot(node, t).gpus[gpu]


def readings(sim: SimCluster, gpus: Iterable[tuple[str, int]], t: float) -> list[GpuReading]:
    return [reading(sim, node, gpu, t) for node, gpu in sorted(gpus)]


def num(value: float | None) -> float:
    """A reading that must be present."""
    assert value is not None
    return value


def median(values: Iterable[float | None]) -> float:
    return statistics.median(v for v in values if v is not None)


def without_cumulative(r: GpuReading) -> GpuReading:
    return dataclasses.replace(r, **{name: None for name in CUMULATIVE if name != "xid_errors"}, xid_errors={})


def sample_times(scenario: Scenario, *edges_min: float) -> list[float]:
    """Each minute of the scenario and beyond its end, plus the steps either side of each edge."""
    times = {at(scenario, m) for m in range(0, 66)}
    for edge in edges_min:
        times |= {at(scenario, edge) - STEP, at(scenario, edge), at(scenario, edge) + STEP}
    return sorted(t for t in times if t >= scenario.start)


def assert_only_target_changed(
    base: SimCluster,
    faulty: SimCluster,
    targets: Iterable[tuple[str, int]],
    start_min: float,
    end_min: float,
) -> None:
    """Outside ``targets`` and outside [start, end) the fault changes nothing: readings equal the fault-free run's.

    After the window the targets may only differ in cumulative counters.
    """
    targets = set(targets)
    scenario = base.scenario
    window = (at(scenario, start_min), at(scenario, end_min))
    for t in sample_times(scenario, start_min, end_min):
        for node in base.node_names():
            expected = base.snapshot(node, t)
            got = _snapshot_or_none(faulty, node, t)
            assert got is not None, f"{node} unreadable at {t}"
            for want, have in zip(expected.gpus, got.gpus, strict=True):
                target = (node, want.gpu) in targets
                if target and window[0] <= t < window[1]:
                    continue
                if target and t >= window[1]:
                    assert without_cumulative(have) == without_cumulative(want), (node, want.gpu, t)
                else:
                    assert have == want, (node, want.gpu, t)
            _assert_records_equal(expected, got, targets, window, t)


def _assert_records_equal(
    expected: NodeSnapshot, got: NodeSnapshot, targets: set[tuple[str, int]], window: tuple[float, float], t: float
) -> None:
    def keep(gpu: int) -> bool:
        return (expected.node, gpu) not in targets or not window[0] <= t < window[1]

    assert [p for p in got.processes if keep(p.gpu)] == [p for p in expected.processes if keep(p.gpu)]
    assert [j for j in got.jobs if keep(j.gpu)] == [j for j in expected.jobs if keep(j.gpu)]
    assert [x for x in got.links if keep(x.gpu)] == [x for x in expected.links if keep(x.gpu)]


def _snapshot_or_none(sim: SimCluster, node: str, t: float) -> NodeSnapshot | None:
    try:
        return sim.snapshot(node, t)
    except NodeUnavailableError:
        return None
