"""Fault kind ``fabric_congestion``: an RDMA port's traffic backs up in the fabric (a hot switch, an oversubscribed
uplink): its transmit wait and, on RoCE, its congestion notifications (CNPs) rise far above its baseline while what
it moves falls to about a third.

A training job spanning nodes whose GPUs use the port slows down: its collectives take three times as long, so
each step is longer and every one of its ports moves about a third of its healthy traffic. Named by ``node`` and
``nic``, or by ``job`` (every port next to the job's GPUs is congested).
"""

from __future__ import annotations

from typing import Final

from gpulens.exporter.sim.faults.kind import (
    REACHES_PORT_USERS,
    FaultKind,
    NicOrJobFaultParams,
    ScenarioView,
    require_multi_node_training,
)
from gpulens.exporter.sim.specs import FaultSpec, JobSpec
from gpulens.exporter.sim.stepstate import PortState, RankShare

CONGESTED_PACE: Final = 1.0 / 3.0  # of the healthy inter-node throughput
MAX_COMM_SHARE: Final = 0.9


class FabricCongestionParams(NicOrJobFaultParams, frozen=True, tag="fabric_congestion"):
    """``node`` and ``nic``, or ``job``; ``at``, ``duration``."""


class FabricCongestion(FaultKind):
    name = "fabric_congestion"
    params = FabricCongestionParams
    target = "nic"
    job_target = True
    fabric = True
    reaches = REACHES_PORT_USERS
    shapes_ranks = True

    def check(self, fault: FaultSpec, job: JobSpec | None, scenario: ScenarioView) -> None:
        require_multi_node_training(self, job)

    def rank_share(self, on_target: bool, comm_fraction: float) -> RankShare:
        """Each collective takes three times as long: the step is longer, a larger share of it in all-reduce."""
        slow = comm_fraction / CONGESTED_PACE
        comm = min(MAX_COMM_SHARE, slow / (1.0 - comm_fraction + slow)) if comm_fraction else 0.0
        return RankShare(1.0 - comm, comm, 0.0, pace=CONGESTED_PACE)

    def fabric_pace(self, fault: FaultSpec, t: float) -> float:
        return CONGESTED_PACE

    def port(self, fault: FaultSpec, t: float, state: PortState) -> None:
        state.congested = True
