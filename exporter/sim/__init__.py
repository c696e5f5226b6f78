"""The simulated GPU cluster behind ``--source sim``: nodes, jobs and faults from a scenario (docs/scenarios.md)."""

from gpulens.exporter.sim.cluster import SimCluster, UnknownNodeError
from gpulens.exporter.sim.faults import FAULT_KINDS, LEAK_TARGET_SHARE
from gpulens.exporter.sim.models import CATALOGUE, GpuModel, find_model
from gpulens.exporter.sim.scenario import load_scenario, parse_scenario
from gpulens.exporter.sim.source import LiveTime, SimAllNodes, SimSource
from gpulens.exporter.sim.specs import FaultSpec, GpuRef, JobSpec, NodeSpec, Scenario

__all__ = [
    "CATALOGUE",
    "FAULT_KINDS",
    "LEAK_TARGET_SHARE",
    "FaultSpec",
    "GpuModel",
    "GpuRef",
    "JobSpec",
    "LiveTime",
    "NodeSpec",
    "Scenario",
    "SimAllNodes",
    "SimCluster",
    "SimSource",
    "UnknownNodeError",
    "find_model",
    "load_scenario",
    "parse_scenario",
]
