"""Fault kind ``fabric_not_ready``: an NVSwitch node whose fabric manager is down, so no GPU joins the NVLink fabric.

While it acts, ``nv-fabricmanager`` is not running and every GPU's fabric state reads ``not_started`` (NVML's
``nvmlDeviceGetGpuFabricInfoV``): what a node reads after a boot whose fabric manager failed to start (a version
that does not match the driver). The node's readings, jobs and NVLink counters are unchanged: on a real node CUDA would
not start, but the scenario's jobs are the scenario's. Needs a GPU model with NVSwitches.
"""

from __future__ import annotations

from gpulens.exporter.sim.faults.kind import FaultCheckError, FaultKind, NodeFaultParams, ScenarioView
from gpulens.exporter.sim.specs import FaultSpec, JobSpec
from gpulens.exporter.sim.stepstate import PlumbingState


class FabricNotReadyParams(NodeFaultParams, frozen=True, tag="fabric_not_ready"):
    """``node``, ``at``, ``duration``."""


class FabricNotReady(FaultKind):
    name = "fabric_not_ready"
    params = FabricNotReadyParams
    target = "node"

    def check(self, fault: FaultSpec, job: JobSpec | None, scenario: ScenarioView) -> None:
        node = scenario.nodes.get(fault.node or "")
        if node is not None and not node.model.nvswitches:
            raise FaultCheckError("node", f"a fabric_not_ready fault needs NVSwitches; {node.model.name} has none")

    def plumbing(self, fault: FaultSpec, t: float, state: PlumbingState) -> None:
        state.fabric_ready = False
