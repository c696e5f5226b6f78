"""In the simulator, a rank's process dying in a job of NCCL 2.29 (RAS's MONITOR stream read by every node's agent)
raises ``CommunicationStall`` with the ``rank_dead`` signature at the first collection after RAS finds it
unresponsive, where status queries in turns alone take until RAS declares it dead."""

from __future__ import annotations

import pytest

from bench.bench_nccl_hang import MONITOR_VERSION, measure

STEP_S = 10.0  # the scenario's step: one collection


@pytest.mark.parametrize("nodes", [2, 32])
def test_rank_dead_fires_within_one_step_with_monitor(nodes: int) -> None:
    with_monitor = measure(nodes, "rank_dead", MONITOR_VERSION)
    polled = measure(nodes, "rank_dead")
    assert with_monitor is not None
    assert with_monitor <= STEP_S
    assert polled is not None
    assert polled > with_monitor
