"""Fault kind ``dead_profiling``: a node's DCGM profiling ratios (SM, tensor, DRAM active) read 0.

A monitoring fault: utilization, NVLink, PCIe and power stay what the running jobs make them.
"""

from __future__ import annotations

from gpulens.exporter.sim.faults.kind import FaultKind, NodeFaultParams
from gpulens.exporter.sim.models import GpuModel
from gpulens.exporter.sim.specs import FaultSpec
from gpulens.exporter.sim.stepstate import GpuState


class DeadProfilingParams(NodeFaultParams, frozen=True, tag="dead_profiling"):
    """``node``, ``at``, ``duration``."""


class DeadProfiling(FaultKind):
    name = "dead_profiling"
    params = DeadProfilingParams
    target = "node"

    def apply(self, state: GpuState, fault: FaultSpec, t: float, model: GpuModel) -> None:
        state.profiling_dead = True
