"""Fault kind ``gpu_missing``: a GPU on the PCI bus that the driver never opened, as after a boot that lost it.

From ``at`` on, the GPU has no reading at all (NVML does not list it), while the node's PCI bus still shows its
address (``NodeSnapshot.hardware``): what a node that booted without one of its GPUs reads. Put ``at`` at the
scenario's start for a GPU missing from the start. Unlike ``gpu_lost`` (a GPU that falls off while monitored and reads
``up = false``), no job may hold it: a scheduler does not place work on a GPU its node does not offer.
"""

from __future__ import annotations

from gpulens.exporter.sim.faults.kind import FaultCheckError, FaultKind, FaultParams, ScenarioView
from gpulens.exporter.sim.models import GpuModel
from gpulens.exporter.sim.specs import FaultSpec, JobSpec
from gpulens.exporter.sim.stepstate import GpuState


class GpuMissingParams(FaultParams, frozen=True, tag="gpu_missing"):
    """``gpu``, ``at`` (its absence lasts to the end; no ``duration``)."""

    gpu: str


class GpuMissing(FaultKind):
    name = "gpu_missing"
    params = GpuMissingParams
    target = "gpu"
    single_event = True

    def check(self, fault: FaultSpec, job: JobSpec | None, scenario: ScenarioView) -> None:
        held = sorted(j.id for j in scenario.jobs.values() if fault.gpu in j.gpus)
        if held:
            raise FaultCheckError("gpu", f"a gpu_missing GPU is held by no job; {', '.join(held)} holds it")

    def apply(self, state: GpuState, fault: FaultSpec, t: float, model: GpuModel) -> None:
        state.missing = True
