"""Fault kind ``ib_link_flap``: an RDMA port goes down for a few seconds, ``count`` times over its window.

The flaps are spread evenly over the window, the first at ``at``; each keeps the port DOWN for a few seconds, and
at least one scenario step so that a reading sees it. ``link_downed`` and ``link_error_recovery`` rise by one per
flap. A training job spanning nodes whose GPUs use the port stalls in its collectives while the port is down, and
resumes when it comes back.
"""

from __future__ import annotations

import math
from typing import Annotated, Final

from msgspec import Meta

from gpulens.exporter.sim.faults.comm_stall import spinning
from gpulens.exporter.sim.faults.ib_link_down import take_down
from gpulens.exporter.sim.faults.kind import (
    REACHES_PORT_USERS,
    FaultCheckError,
    FaultKind,
    NicOrJobFaultParams,
    ScenarioView,
)
from gpulens.exporter.sim.specs import FaultSpec, JobSpec
from gpulens.exporter.sim.stepstate import STALL, JobPhase, PortCounters, PortState

DEFAULT_FLAPS: Final = 3
FLAP_DOWN_S: Final = 4.0  # how long each flap keeps the port down (at least one step)


class IbLinkFlapParams(NicOrJobFaultParams, frozen=True, tag="ib_link_flap"):
    """``node`` and ``nic``, or ``job``; ``at``, ``duration``, ``count`` (flaps, default 3)."""

    count: Annotated[int, Meta(ge=1, le=1000)] = DEFAULT_FLAPS


def _gap(fault: FaultSpec) -> float:
    return (fault.end - fault.start) / (fault.count or DEFAULT_FLAPS)


def _down_s(fault: FaultSpec) -> float:
    return max(FLAP_DOWN_S, fault.step_s)


def flaps_by(fault: FaultSpec, t: float) -> int:
    """Flaps begun by ``t``."""
    if t < fault.start:
        return 0
    return min(fault.count or DEFAULT_FLAPS, math.floor((t - fault.start) / _gap(fault) + 1e-9) + 1)


def down_at(fault: FaultSpec, t: float) -> bool:
    if not fault.active(t):
        return False
    began = fault.start + (flaps_by(fault, t) - 1) * _gap(fault)
    return t < began + _down_s(fault) - 1e-9


class IbLinkFlap(FaultKind):
    name = "ib_link_flap"
    params = IbLinkFlapParams
    target = "nic"
    job_target = True  # or every port next to the job's GPUs
    fabric = True
    reaches = REACHES_PORT_USERS
    phase_priority = 7

    def extras(self, params: IbLinkFlapParams) -> dict[str, int]:
        return {"count": params.count}

    def check(self, fault: FaultSpec, job: JobSpec | None, scenario: ScenarioView) -> None:
        if _gap(fault) < 2 * _down_s(fault) - 1e-9:
            raise FaultCheckError(
                "count",
                f"{fault.count} flaps do not fit in the fault's window: each keeps the port down "
                f"{_down_s(fault):g}s (at least one step) and needs as long up again; lengthen duration or lower count",
            )

    def takes_phase(self, fault: FaultSpec, t: float) -> bool:
        return down_at(fault, t)

    def job_phase(self, fault: FaultSpec) -> JobPhase:
        return JobPhase(STALL, activity=spinning)

    def port(self, fault: FaultSpec, t: float, state: PortState) -> None:
        if down_at(fault, t):
            take_down(state)

    def port_count(self, fault: FaultSpec, t: float, elapsed_s: float, counters: PortCounters) -> None:
        flaps = flaps_by(fault, t)
        counters.link_downed += flaps
        counters.link_error_recovery += flaps
