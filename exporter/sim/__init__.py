"""The simulated GPU cluster behind ``--source sim``: nodes, jobs and faults from a scenario (docs/scenarios.md)."""

from .engine import SimCluster, UnknownNodeError
from .models import CATALOGUE, GpuModel, find_model
from .scenario import FaultSpec, GpuRef, JobSpec, NodeSpec, Scenario, load_scenario, parse_scenario
from .source import LiveTime, SimAllNodes, SimSource

__all__ = [
    "CATALOGUE",
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
