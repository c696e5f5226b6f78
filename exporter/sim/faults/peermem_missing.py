"""Fault kind ``peermem_missing``: a node with RDMA ports where ``nvidia_peermem`` is not loaded.

While it acts, the node reads ``nvidia_peermem`` not loaded (``/sys/module/nvidia_peermem`` absent): GPUDirect RDMA
is off, so NCCL stages inter-node traffic through host memory. The node's readings and traffic are unchanged (the
staging costs some bandwidth the simulator does not model). Needs a node with RDMA ports.
"""

from __future__ import annotations

from gpulens.exporter.sim.faults.kind import FaultCheckError, FaultKind, NodeFaultParams, ScenarioView
from gpulens.exporter.sim.specs import FaultSpec, JobSpec
from gpulens.exporter.sim.stepstate import PlumbingState


class PeermemMissingParams(NodeFaultParams, frozen=True, tag="peermem_missing"):
    """``node``, ``at``, ``duration``."""


class PeermemMissing(FaultKind):
    name = "peermem_missing"
    params = PeermemMissingParams
    target = "node"

    def check(self, fault: FaultSpec, job: JobSpec | None, scenario: ScenarioView) -> None:
        node = scenario.nodes.get(fault.node or "")
        if node is not None and not node.nics:
            raise FaultCheckError("node", f"a peermem_missing fault needs RDMA ports; {node.name} has none")

    def plumbing(self, fault: FaultSpec, t: float, state: PlumbingState) -> None:
        state.peermem_loaded = False
