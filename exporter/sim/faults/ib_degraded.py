"""Fault kind ``ib_degraded``: an RDMA port trains at half its lanes (width 4 -> 2), so its rate halves.

The port stays up (ACTIVE, LinkUp), its ``rate_bytes_per_second`` and ``link_width`` halve, and whatever traffic
its jobs send is capped below the new rate.
"""

from __future__ import annotations

from typing import Final

from gpulens.exporter.sim.faults.kind import FaultKind, NicOrJobFaultParams
from gpulens.exporter.sim.specs import FaultSpec
from gpulens.exporter.sim.stepstate import PortState

DEGRADED_RATE_SHARE: Final = 0.5
DEGRADED_WIDTH: Final = 2


class IbDegradedParams(NicOrJobFaultParams, frozen=True, tag="ib_degraded"):
    """``node`` and ``nic``, or ``job``; ``at``, ``duration``."""


class IbDegraded(FaultKind):
    name = "ib_degraded"
    params = IbDegradedParams
    target = "nic"
    job_target = True  # or every port next to the job's GPUs
    fabric = True

    def port(self, fault: FaultSpec, t: float, state: PortState) -> None:
        state.rate_share = min(state.rate_share, DEGRADED_RATE_SHARE)
        state.link_width = DEGRADED_WIDTH
