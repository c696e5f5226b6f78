"""The causal table, as data: which firing alert explains which, how they are joined, and each cause's action.

One ``Explains`` row says that an alert of a ``causes`` rule explains an alert of an ``effects`` rule when the
``join`` holds between their labels (``alerts.incidents`` implements each join by its name):

* ``job_on_gpu``: the cause's GPU is held by the effect's job (the cause's ``job_id`` lists it), or the cause is about
  a whole node (no ``gpu`` label) on which the effect's job runs (its ``nodes`` or ``node``);
* ``stuck_gpu``: the effect is a ``rank_dead`` / ``rank_missing`` stall whose stuck rank runs on the cause's GPU
  (the stall's ``stuck_at`` annotation: ``rank@node:gpu``);
* ``named_gpu``: the effect names the cause's GPU (a straggler's ``node`` and ``gpu``);
* ``port_job``: the cause's port carries the effect's job (the port alert's ``job_id`` lists the jobs on its GPUs);
* ``node``: the cause is about the node the effect is on.

``HostMemoryPressure`` and ``HostCpuContention`` on a node explain the ``JobInputBound`` of the jobs on it
(``job_on_gpu``: a whole-node cause): the culprit is the node, the cause named. A ``JobInputBound`` that neither
explains (its host's iowait alone) still culprits its host (``OWN_CULPRIT``), with the job in the blast radius.

``LAYERS`` orders the culprit kinds from the lowest (a node: everything on it fails with it) to the highest (a job);
``RULE_ACTIONS`` gives each rule's action in the XID catalogue's vocabulary (``XidError`` takes its code's). Rules
not listed as causes only ever culprit their own incident.

A site adds rows of its own in the config (``[[alerts.causes]]``, ``alerts.causeconfig``): they are ``Explains`` rows
whose ``when`` matchers the cause alert's labels must meet, appended to ``CAUSAL_TABLE`` (``table``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from gpulens.alerts.matchers import Matcher
from gpulens.alerts.names import (
    COMMUNICATION_STALL,
    ECC_UNCORRECTABLE,
    EXPORTER_DOWN,
    FABRIC_CONGESTION,
    FABRIC_SATURATED,
    GPU_DRIVER_HUNG,
    GPU_FABRIC_NOT_READY,
    GPU_LOST,
    GPU_MISSING,
    HOST_CPU_CONTENTION,
    HOST_MEMORY_PRESSURE,
    IB_ERRORS,
    IB_LINK_DEGRADED,
    IB_LINK_DOWN,
    IB_LINK_FLAPPING,
    IDLE_ALLOCATED,
    JOB_INEFFICIENT,
    JOB_INPUT_BOUND,
    JOB_STRAGGLER,
    MEMORY_SATURATED,
    NVLINK_ERRORS,
    NVLINK_SATURATED,
    PCIE_SATURATED,
    POWER_CAPPED,
    THERMAL_THROTTLING,
    WATCHDOG,
    XID_ERROR,
)
from gpulens.xidcatalogue import ACTIONS, CHECK_APPLICATION, HARDWARE_INSPECTION, NONE, REBOOT, RESET_GPU

JOINS: Final = ("job_on_gpu", "stuck_gpu", "named_gpu", "port_job", "node")


@dataclass(frozen=True)
class Explains:
    """A firing alert of a ``causes`` rule explains a firing alert of an ``effects`` rule where ``join`` holds."""

    causes: tuple[str, ...]
    effects: tuple[str, ...]
    join: str
    why: str
    when: tuple[Matcher, ...] = ()  # label matchers the cause alert meets (config rows; the builtin ones take none)

    def __post_init__(self) -> None:
        if self.join not in JOINS:
            raise ValueError(f"unknown join {self.join!r}")


GPU_FAULTS: Final = (GPU_LOST, GPU_MISSING, XID_ERROR, ECC_UNCORRECTABLE, GPU_DRIVER_HUNG)
PORT_FAULTS: Final = (IB_LINK_DOWN, IB_LINK_FLAPPING, IB_LINK_DEGRADED, IB_ERRORS, FABRIC_CONGESTION)
GPU_SLOWDOWNS: Final = (THERMAL_THROTTLING, POWER_CAPPED, NVLINK_ERRORS)
JOB_EFFECTS: Final = (COMMUNICATION_STALL, JOB_STRAGGLER, JOB_INEFFICIENT, IDLE_ALLOCATED)
NODE_FAULTS: Final = (EXPORTER_DOWN, GPU_DRIVER_HUNG, GPU_FABRIC_NOT_READY)
HOST_PRESSURE: Final = (HOST_MEMORY_PRESSURE, HOST_CPU_CONTENTION)

CAUSAL_TABLE: Final = (
    Explains(GPU_FAULTS, JOB_EFFECTS, "job_on_gpu", "a GPU fault stalls, slows or idles every job on that GPU"),
    Explains(GPU_FAULTS, (COMMUNICATION_STALL,), "stuck_gpu", "a dead or missing rank runs on the faulty GPU"),
    Explains(PORT_FAULTS, (COMMUNICATION_STALL, JOB_STRAGGLER, JOB_INEFFICIENT), "port_job", "a port under the job"),
    Explains(GPU_SLOWDOWNS, (JOB_STRAGGLER,), "named_gpu", "the straggler's GPU is throttled or its NVLinks fail"),
    Explains(NODE_FAULTS, ("*",), "node", "a node that does not answer or is unhealthy explains all on it"),
    Explains(HOST_PRESSURE, (JOB_INPUT_BOUND,), "job_on_gpu", "the host's memory or CPUs starve the job's loader"),
)


def table(extra: Sequence[Explains] = ()) -> tuple[Explains, ...]:
    """The causal table the incidents are formed by: the builtin rows, then the config's (``[[alerts.causes]]``)."""
    return (*CAUSAL_TABLE, *extra)


# Rules whose alerts on several GPUs or ports of one job are one incident, whose culprit is the job: what the job's
# own load does (it saturates its links, congests its fabric, leaves its GPUs idle), not a fault of each part.
JOB_WIDE: Final = frozenset(
    {
        NVLINK_SATURATED,
        PCIE_SATURATED,
        FABRIC_SATURATED,
        FABRIC_CONGESTION,
        MEMORY_SATURATED,
        IDLE_ALLOCATED,
        JOB_INEFFICIENT,
    }
)

# Alerts that are never part of an incident: the heartbeat.
NOT_FAULTS: Final = frozenset({WATCHDOG})

# The culprit kinds, lowest layer first.
LAYERS: Final = ("node", "port", "gpu", "rank", "job")

# Rules whose culprit, when nothing explains them, is not what their labels name first (a GPU, a port, a rank, a job).
OWN_CULPRIT: Final = {
    JOB_INPUT_BOUND: "node",  # its host's CPU, memory or I/O starve the loader
    IDLE_ALLOCATED: "job",  # the job holds a GPU it does not use
    JOB_INEFFICIENT: "job",
    EXPORTER_DOWN: "node",
    GPU_DRIVER_HUNG: "node",
}

# Each rule's action in the catalogue's vocabulary (``XidError``: its code's, ``xidcatalogue.xid_action``).
RULE_ACTIONS: Final = {
    GPU_LOST: REBOOT,
    GPU_MISSING: HARDWARE_INSPECTION,
    ECC_UNCORRECTABLE: RESET_GPU,
    GPU_DRIVER_HUNG: REBOOT,
    EXPORTER_DOWN: CHECK_APPLICATION,
    GPU_FABRIC_NOT_READY: REBOOT,
    IB_LINK_DOWN: HARDWARE_INSPECTION,
    IB_LINK_FLAPPING: HARDWARE_INSPECTION,
    IB_LINK_DEGRADED: HARDWARE_INSPECTION,
    IB_ERRORS: HARDWARE_INSPECTION,
    NVLINK_ERRORS: RESET_GPU,
    THERMAL_THROTTLING: HARDWARE_INSPECTION,
    COMMUNICATION_STALL: CHECK_APPLICATION,
    JOB_STRAGGLER: CHECK_APPLICATION,
    JOB_INPUT_BOUND: CHECK_APPLICATION,
    HOST_MEMORY_PRESSURE: CHECK_APPLICATION,
    HOST_CPU_CONTENTION: CHECK_APPLICATION,
    JOB_INEFFICIENT: CHECK_APPLICATION,
    IDLE_ALLOCATED: CHECK_APPLICATION,
}
DEFAULT_ACTION: Final = NONE

assert all(a in ACTIONS for a in RULE_ACTIONS.values())


def action_rank(action: str) -> int:
    """How strong an action is: the catalogue's order (``none`` < ... < ``hardware-inspection``)."""
    return ACTIONS.index(action) if action in ACTIONS else 0
