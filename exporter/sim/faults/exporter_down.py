"""Fault kind ``exporter_down``: a node's exporter cannot be read (``NodeUnavailableError``, HTTP 503)."""

from __future__ import annotations

from gpulens.exporter.sim.faults.kind import FaultKind, NodeFaultParams
from gpulens.exporter.sim.specs import FaultSpec


class ExporterDownParams(NodeFaultParams, frozen=True, tag="exporter_down"):
    """``node``, ``at``, ``duration``."""


class ExporterDown(FaultKind):
    name = "exporter_down"
    params = ExporterDownParams
    target = "node"
    takes_node_offline = True

    def offline_message(self, fault: FaultSpec, node: str, until: str) -> str:
        return f"{node}: the exporter is down (simulated exporter_down until {until})"
