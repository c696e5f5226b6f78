"""The simulated GPU cluster behind ``--source sim``: nodes, jobs and faults from a scenario (docs/scenarios.md)."""

from .cluster import SimCluster, UnknownNodeError
from .faults import FAULT_KINDS, LEAK_TARGET_SHARE
from .models import CATALOGUE, GpuModel, find_model
from .scenario import load_scenario, parse_scenario
from .source import LiveTime, SimAllNodes, SimSource
from .specs import FaultSpec, GpuRef, JobSpec, NodeSpec, Scenario

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
