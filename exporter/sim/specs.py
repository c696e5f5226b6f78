"""The parsed scenario: validated nodes, jobs and faults with times in epoch seconds (what the engine runs).

``exporter.sim.scenario`` builds these from a scenario file; the engine, the job behaviour and the fault kinds read
them.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpulens.exporter.sim.models import GpuModel


@dataclass(frozen=True, slots=True, order=True)
class GpuRef:
    """One GPU of the cluster: a node name and an index on that node."""

    node: str
    index: int

    def __str__(self) -> str:
        return f"{self.node}:{self.index}"


@dataclass(frozen=True, slots=True)
class NicSpec:
    """One RDMA port of a node: its device name, link, placement and the GPUs it is nearest to."""

    device: str  # "mlx5_0"
    port: int
    link_layer: str  # "InfiniBand" or "Ethernet" (RoCE)
    rate_bytes_per_second: float
    link_width: int
    link_speed: str | None  # per-lane speed name ("NDR"), None when the rate has none
    gpus: tuple[int, ...]
    pci_bus_id: str
    numa_node: int


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    model: GpuModel
    gpus: int
    nics: tuple[NicSpec, ...] = ()  # the scenario reader fills them in from the model's defaults and overrides

    def nic(self, device: str) -> NicSpec | None:
        return next((n for n in self.nics if n.device == device), None)


@dataclass(frozen=True, slots=True, eq=False)
class JobSpec:
    """A job holding GPUs from ``start`` to ``end`` (epoch seconds)."""

    id: str
    user: str
    kind: str
    gpus: tuple[GpuRef, ...]
    start: float
    end: float
    memory_fraction: float
    checkpoint_every_s: float | None = None
    checkpoint_duration_s: float | None = None  # None: 1-3 steps per checkpoint
    # The ranks that alone write each checkpoint while the others launch the next collective and wait (NCCL RAS
    # shows these one operation behind for the whole save); empty: every rank pauses at the same count.
    checkpoint_ranks: tuple[GpuRef, ...] = ()
    checkpoint_stuck_s: float | None = None  # the first save at or after this time never ends (writers stuck in I/O)
    eval_every_s: float | None = None
    eval_duration_s: float | None = None
    first_step_s: float | None = None  # a slow first step (compilation, warm-up) from the job's start
    nccl_ras: bool = True  # NCCL RAS answers for the job (NCCL 2.24 or later with RAS on)
    nccl_version: str = "2.28.7"
    nccl_inspector: bool = False  # its ranks run NCCL's Inspector (docs/nccl-inspector.md)

    def running(self, t: float) -> bool:
        return self.start <= t < self.end


@dataclass(frozen=True, slots=True, eq=False)
class FaultSpec:
    """A fault from ``start`` to ``end`` (epoch seconds) on a job, a GPU or a node, as its kind requires.

    ``job`` is the job a job-scoped fault names, and for a ``straggler`` the training job it slows down. ``ranks``
    are the GPUs of its job that a kind taking ranks (``hang_mixed``) acts on alone. ``nic`` is the device a
    fabric fault names on ``node``; ``jobs_hit`` the jobs a fabric or host fault on a port or node reaches (those
    using the port, or running on the node, at its start); ``count`` a kind's repeat count (``ib_link_flap``).
    """

    index: int  # its position among the scenario's [[faults]]
    kind: str
    start: float
    end: float
    job: str | None = None
    gpu: GpuRef | None = None
    node: str | None = None
    xid: int | None = None
    ranks: tuple[GpuRef, ...] = ()
    stuck: tuple[GpuRef, ...] = ()  # hangs: the GPUs whose ranks never launch the collective (NCCL RAS's view)
    nic: str | None = None
    jobs_hit: tuple[str, ...] = ()
    count: int | None = None
    switch: int | None = None  # sxid: the NVSwitch (0-based) that reports it; ``xid`` holds the SXid code
    step_s: float = 0.0  # the scenario's step: an effect that must last a step to be seen (a flap) knows it

    def active(self, t: float) -> bool:
        return self.start <= t < self.end


@dataclass(frozen=True, slots=True)
class Scenario:
    """A parsed, validated scenario. Times are epoch seconds."""

    source: str
    start: float
    duration_s: float
    step_s: float
    seed: int
    nodes: tuple[NodeSpec, ...]
    jobs: tuple[JobSpec, ...] = ()
    faults: tuple[FaultSpec, ...] = ()

    @property
    def end(self) -> float:
        return self.start + self.duration_s
