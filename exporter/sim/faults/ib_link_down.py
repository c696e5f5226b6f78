"""Fault kind ``ib_link_down``: an RDMA port goes down (``state`` DOWN, ``phys_state`` Polling) for its whole window.

The port carries nothing while it is down and its ``link_downed`` counter rises by one. A training job spanning
nodes whose GPUs use the port hangs in its collectives, the way NCCL does when a NIC drops (it hangs rather than
fails): every rank spins (:func:`~.comm_stall.spinning`) and none of the job's ports move data. Named by ``node``
and ``nic``, or by ``job`` (then every port next to the job's GPUs goes down).
"""

from __future__ import annotations

from typing import Final

from gpulens.exporter.sim.faults.comm_stall import spinning
from gpulens.exporter.sim.faults.kind import (
    REACHES_PORT_USERS,
    FaultKind,
    NicOrJobFaultParams,
    ScenarioView,
    require_multi_node_training,
)
from gpulens.exporter.sim.specs import FaultSpec, JobSpec
from gpulens.exporter.sim.stepstate import STALL, JobPhase, PortCounters, PortState

PORT_DOWN: Final = "DOWN"
PHYS_POLLING: Final = "Polling"  # the port is looking for a peer: the cable or the switch port is gone


class IbLinkDownParams(NicOrJobFaultParams, frozen=True, tag="ib_link_down"):
    """``node`` and ``nic``, or ``job``; ``at``, ``duration``."""


def take_down(state: PortState) -> None:
    state.up = False
    state.state = PORT_DOWN
    state.phys_state = PHYS_POLLING


class IbLinkDown(FaultKind):
    name = "ib_link_down"
    params = IbLinkDownParams
    target = "nic"
    job_target = True
    fabric = True
    reaches = REACHES_PORT_USERS
    phase_priority = 6

    def check(self, fault: FaultSpec, job: JobSpec | None, scenario: ScenarioView) -> None:
        require_multi_node_training(self, job)

    def job_phase(self, fault: FaultSpec) -> JobPhase:
        return JobPhase(STALL, activity=spinning)

    def port(self, fault: FaultSpec, t: float, state: PortState) -> None:
        take_down(state)

    def port_count(self, fault: FaultSpec, t: float, elapsed_s: float, counters: PortCounters) -> None:
        counters.link_downed += 1
