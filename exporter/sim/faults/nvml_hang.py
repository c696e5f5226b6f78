"""Fault kind ``nvml_hang``: the node's GPU driver wedges; NVML calls stop returning.

Its signature is what a real exporter serves in that case (docs/exporter.md): the node answers, its GPU readings
are withdrawn (marked stale, ``stale = {"gpus": <seconds since the hang>}``), ``nvml_hung_since`` says since when,
and its jobs, fabric and host readings go on. ``GpuDriverHung`` fires; ``ExporterDown`` stays silent.
"""

from __future__ import annotations

from gpulens.exporter.sim.faults.kind import FaultKind, NodeFaultParams


class NvmlHangParams(NodeFaultParams, frozen=True, tag="nvml_hang"):
    """``node``, ``at``, ``duration``."""


class NvmlHang(FaultKind):
    name = "nvml_hang"
    params = NvmlHangParams
    target = "node"
    hangs_nvml = True
