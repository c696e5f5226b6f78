"""Fault kind ``ib_errors``: a marginal cable or transceiver: symbol errors, link integrity errors and receive
errors climb on an RDMA port while it stays up and keeps carrying its traffic."""

from __future__ import annotations

from typing import Final

from gpulens.exporter.sim.faults.kind import FaultKind, NicOrJobFaultParams
from gpulens.exporter.sim.specs import FaultSpec
from gpulens.exporter.sim.stepstate import PortCounters

SYMBOL_ERRORS_PER_S: Final = 2.0
RECEIVE_ERRORS_PER_S: Final = 0.8
LINK_INTEGRITY_ERRORS_PER_S: Final = 0.1


class IbErrorsParams(NicOrJobFaultParams, frozen=True, tag="ib_errors"):
    """``node`` and ``nic``, or ``job``; ``at``, ``duration``."""


class IbErrors(FaultKind):
    name = "ib_errors"
    params = IbErrorsParams
    target = "nic"
    job_target = True  # or every port next to the job's GPUs
    fabric = True

    def port_count(self, fault: FaultSpec, t: float, elapsed_s: float, counters: PortCounters) -> None:
        counters.symbol_errors += int(SYMBOL_ERRORS_PER_S * elapsed_s)
        counters.receive_errors += int(RECEIVE_ERRORS_PER_S * elapsed_s)
        counters.local_link_integrity_errors += int(LINK_INTEGRITY_ERRORS_PER_S * elapsed_s)
