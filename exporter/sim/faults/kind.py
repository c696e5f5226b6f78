"""What a fault kind is: its scenario keys (a typed struct), its checks, and its effect hooks on jobs and GPUs.

Every kind is one :class:`FaultKind` subclass in its own module of ``gpulens.exporter.sim.faults``, registered in
``exporter/sim/faults/__init__.py``. The scenario reader converts a ``[[faults]]`` table to the kind's ``params``
struct (msgspec picks it by ``kind``), resolves the target and window, then calls :meth:`FaultKind.check`. The
engine calls the effect hooks while the fault is active: :meth:`~FaultKind.job_phase` (take over the job's phase),
:meth:`~FaultKind.rank_share` (reshape a training rank's step), :meth:`~FaultKind.apply` (adjust one GPU's state)
and :meth:`~FaultKind.count` (add to its counters).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from gpulens.exporter.sim.models import GpuModel
from gpulens.exporter.sim.specs import FaultSpec, JobSpec, NodeSpec
from gpulens.exporter.sim.stepstate import (
    Counters,
    GpuState,
    HostState,
    JobPhase,
    PlumbingState,
    PortCounters,
    PortState,
    RankShare,
)
from gpulens.typedinput import InputStruct

TARGET_KEYS: Final = ("job", "gpu", "node", "nic")
# What a fault on a port or a node reaches (FaultKind.reaches): the jobs spanning nodes whose GPUs use the port, or
# every job on the node.
REACHES_PORT_USERS: Final = "port"
REACHES_NODE_JOBS: Final = "node"

# A time as a scenario writes it: an offset such as "20m", a number of seconds, or an RFC 3339 time.
TimeValue = str | int | float
# A duration: "90s", "5m", "1h30m" or a number of seconds.
DurationValue = str | int | float


class FaultParams(InputStruct, frozen=True, tag_field="kind"):
    """The keys of one ``[[faults]]`` table; each kind's struct adds its target key and its own parameters."""

    at: TimeValue


class JobFaultParams(FaultParams, frozen=True):
    job: str
    duration: DurationValue | None = None


class GpuFaultParams(FaultParams, frozen=True):
    gpu: str
    duration: DurationValue | None = None


class NodeFaultParams(FaultParams, frozen=True):
    node: str
    duration: DurationValue | None = None


class NicFaultParams(FaultParams, frozen=True):
    """A fault on one RDMA port: ``node`` and ``nic`` (its device name, e.g. ``mlx5_2``)."""

    node: str
    nic: str
    duration: DurationValue | None = None


class NicOrJobFaultParams(FaultParams, frozen=True):
    """A fault on one RDMA port (``node`` and ``nic``), or on the ports next to a job's GPUs (``job``)."""

    node: str | None = None
    nic: str | None = None
    job: str | None = None
    duration: DurationValue | None = None


class NodeOrJobFaultParams(FaultParams, frozen=True):
    """A fault on a node's host (``node``), or on the hosts of a job's nodes (``job``)."""

    node: str | None = None
    job: str | None = None
    duration: DurationValue | None = None


class FaultCheckError(Exception):
    """A fault that its kind rejects; the scenario reader reports it at ``key`` of the fault's table."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key
        self.message = message


@dataclass(frozen=True, slots=True)
class ScenarioView:
    """What a kind's check may look at: the scenario's nodes and jobs, by name."""

    nodes: Mapping[str, NodeSpec]
    jobs: Mapping[str, JobSpec]
    step_s: float = 0.0


class FaultKind:
    """One fault kind. Subclasses set the class attributes and override the hooks their effect needs."""

    name: ClassVar[str]
    params: ClassVar[type[FaultParams]]
    target: ClassVar[str]  # the key naming what it acts on: "job", "gpu", "node" or "nic" (with "node")
    # Acts while a job runs: its window must lie inside the job's, it lasts until the job ends without a
    # duration, and while it acts the job takes no data-loader or checkpoint pauses. A GPU-scoped kind acts in
    # the job holding its GPU at ``at``.
    job_bound: ClassVar[bool] = False
    single_event: ClassVar[bool] = False  # happens once at ``at``: takes no duration, its effect stays
    phase_priority: ClassVar[int | None] = None  # takes over its job's phase (job_phase); the lowest wins
    shapes_ranks: ClassVar[bool] = False  # reshapes its training job's ranks (rank_share)
    takes_node_offline: ClassVar[bool] = False  # reading its node fails while it acts
    hangs_nvml: ClassVar[bool] = False  # its node's NVML is hung while it acts: GPU readings withdrawn, the rest read
    # Fabric and host kinds act on RDMA ports and hosts; they reach GPUs only through the jobs they hit
    # (FaultSpec.jobs_hit): the job they name, or what ``reaches`` says for a port or a node.
    fabric: ClassVar[bool] = False
    job_target: ClassVar[bool] = False  # a "nic" or "node" kind that may name a ``job`` instead
    reaches: ClassVar[str | None] = None  # REACHES_PORT_USERS, REACHES_NODE_JOBS or None (no job feels it)

    # ----------------------------------------------------------------------------------------- validation

    def unknown_key(self, key: str) -> str:
        """The message for a key this kind's ``params`` lacks."""
        if key in TARGET_KEYS:
            named = "a node and a nic" if self.target == "nic" else f"a {self.target}"
            return f"a {self.name} fault names {named}{' or a job' if self.job_target else ''}, not a {key}"
        if key == "xid":
            return "only xid and kernel_xid faults take an xid code"
        return "unknown key"

    def extras(self, params: Any) -> Mapping[str, Any]:
        """Fields of :class:`FaultSpec` beyond target and window that this kind's parameters fill in."""
        return {}

    def ranks(self, params: Any) -> str | list[str] | None:
        """The GPU ranges of its ``ranks`` key (resolved into ``FaultSpec.ranks``: GPUs of its job it acts on
        alone, through ``apply``), or ``None`` for a kind without one."""
        return None

    def stuck_ranks(self, params: Any) -> str | list[str] | None:
        """The GPU ranges of a hang's ``stuck_ranks`` key (resolved into ``FaultSpec.stuck``), or ``None``."""
        return getattr(params, "stuck_ranks", None)

    def check(self, fault: FaultSpec, job: JobSpec | None, scenario: ScenarioView) -> None:
        """Reject a fault this kind cannot act as (raise :class:`FaultCheckError`); ``job``: the job it acts in."""

    # ----------------------------------------------------------------------------------------- effect

    def job_phase(self, fault: FaultSpec) -> JobPhase:
        """The phase of the fault's job while it acts (kinds with a ``phase_priority``)."""
        raise NotImplementedError

    def rank_share(self, on_target: bool, comm_fraction: float) -> RankShare:
        """How a rank of the fault's job splits a step while it acts (kinds that ``shapes_ranks``)."""
        raise NotImplementedError

    def apply(self, state: GpuState, fault: FaultSpec, t: float, model: GpuModel) -> None:
        """What the fault does to its GPU (or to each GPU of its node) during the step at ``t``."""

    def count(self, fault: FaultSpec, elapsed_s: float, counters: Counters) -> None:
        """What the fault has added to its GPU's counters ``elapsed_s`` after it began."""

    def takes_phase(self, fault: FaultSpec, t: float) -> bool:
        """Whether the fault takes over its job's phase at ``t`` (kinds with a ``phase_priority``; a flapping
        link only while it is down)."""
        return True

    def fabric_pace(self, fault: FaultSpec, t: float) -> float:
        """How fast a job it hits moves its inter-node traffic at ``t``, against a healthy job (fabric kinds)."""
        return 1.0

    def port(self, fault: FaultSpec, t: float, state: PortState) -> None:
        """What the fault does to its port (or each port next to its job's GPUs) during the step at ``t``."""

    def port_count(self, fault: FaultSpec, t: float, elapsed_s: float, counters: PortCounters) -> None:
        """What the fault has added to its port's error counters by ``t``, ``elapsed_s`` (in counter seconds)
        after it began."""

    def host(self, fault: FaultSpec, t: float, state: HostState) -> None:
        """What the fault does to its node's host (or each host of its job) during the step at ``t``."""

    def plumbing(self, fault: FaultSpec, t: float, state: PlumbingState) -> None:
        """What the fault does to its node's plumbing (fabric manager, GPU fabric, nvidia_peermem) at ``t``."""

    def offline_message(self, fault: FaultSpec, node: str, until: str) -> str:
        """Why ``node`` cannot be read (kinds that take it offline)."""
        return f"{node}: unavailable (simulated {self.name} until {until})"


def require_multi_gpu_training(kind: FaultKind, job: JobSpec | None) -> None:
    """Communication faults need a training job whose ranks talk to each other."""
    if job is not None and (job.kind != "training" or len(job.gpus) < 2):
        raise FaultCheckError(kind.target, f"a {kind.name} fault needs a training job with 2 or more GPUs")


def require_multi_node_training(kind: FaultKind, job: JobSpec | None) -> None:
    """A fault a job feels through the fabric needs a training job spanning two or more nodes."""
    if job is not None and (job.kind != "training" or len({g.node for g in job.gpus}) < 2):
        raise FaultCheckError("job", f"a {kind.name} fault needs a training job that spans 2 or more nodes")


def require_training(kind: FaultKind, job: JobSpec | None) -> None:
    """An input-pipeline fault needs a training job (one that reads data every step)."""
    if job is not None and job.kind != "training":
        raise FaultCheckError("job", f"a {kind.name} fault needs a training job")
