"""The GpuSource and MultiNodeSource adapters, read through injected clocks."""

from __future__ import annotations

import pytest

from gpulens.clock import ManualClock, ScaledClock
from gpulens.exporter.sim import SimAllNodes, SimSource, UnknownNodeError
from gpulens.model import GpuSource, MultiNodeSource, NodeUnavailableError
from tests.sim.support import STEP, at, cluster

DOWN = """
[[faults]]
kind = "exporter_down"
node = "node-01"
at = "10m"
duration = "5m"
"""


def test_sim_source_reads_its_node_at_the_clocks_virtual_time() -> None:
    sim = cluster()
    clock = ManualClock(at(sim.scenario, 3))
    source: GpuSource = SimSource(sim, "node-02", clock)
    first = source.read()
    assert (first.node, first.source, first.timestamp) == ("node-02", "sim", at(sim.scenario, 3))
    assert first == sim.snapshot("node-02", clock.now())
    clock.advance(STEP)
    assert source.read().timestamp == at(sim.scenario, 3) + STEP
    source.close()
    assert source.read().node == "node-02"  # close releases nothing the simulation needs


def test_scaled_clock_runs_virtual_time_faster() -> None:
    sim = cluster()
    wall = ManualClock(1_000.0)
    source = SimSource(sim, "node-00", ScaledClock(start=sim.scenario.start, speed=60.0, base=wall))
    assert source.read().timestamp == sim.scenario.start
    wall.advance(10.0)  # ten real seconds are ten virtual minutes
    assert source.read().timestamp == at(sim.scenario, 10)


def test_unknown_node_is_a_key_error_naming_the_node() -> None:
    sim = cluster()
    with pytest.raises(UnknownNodeError) as info:
        SimSource(sim, "node-42", ManualClock(sim.scenario.start))
    assert isinstance(info.value, KeyError)
    assert "node-42" in str(info.value)
    assert "node-00" in str(info.value)
    with pytest.raises(KeyError):
        sim.snapshot("node-42", sim.scenario.start)


def test_all_nodes_source_serves_every_node_and_reports_a_down_one() -> None:
    sim = cluster(DOWN)
    clock = ManualClock(at(sim.scenario, 11))
    source: MultiNodeSource = SimAllNodes(sim, clock)
    assert source.node_names() == ["node-00", "node-01", "node-02", "node-03"]
    assert source.read_node("node-03").node == "node-03"
    with pytest.raises(NodeUnavailableError):
        source.read_node("node-01")
    clock.set(at(sim.scenario, 15))
    assert source.read_node("node-01").timestamp == at(sim.scenario, 15)
    with pytest.raises(UnknownNodeError):
        source.read_node("node-99")
    source.close()
