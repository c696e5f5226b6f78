"""What a simulated GPU does during one step, before noise: the records that job behaviour and faults shape.

A job's :class:`JobPhase` (what it does this step) becomes an :class:`Activity` on each of its GPUs (ratios such
as utilization and link shares); the engine wraps it in a :class:`GpuState` that fault kinds adjust in place (power
limit, clocks, link training, heat), and sums fault :class:`Counters` (link errors, XIDs). The engine then turns the
state into readings and adds noise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from gpulens.exporter.sim.specs import JobSpec

# A job's modes (JobPhase.mode).
RUN: Final = "run"
DATA_WAIT: Final = "data_wait"
CHECKPOINT: Final = "checkpoint"
STALL: Final = "stall"
IDLE: Final = "idle"
SERVE: Final = "serve"
BURST: Final = "burst"
QUIET: Final = "quiet"
EVAL: Final = "eval"
CHECKPOINT_WRITE: Final = "checkpoint_write"
WARMUP: Final = "warmup"
STARVED: Final = "starved"  # training, its input pipeline starved (host CPU or memory): GPUs mostly idle

# A rank spinning in a collective draws about what the GPU draws idle: measured on an H200, 123 W spinning against
# 122 W idle right after load (docs/domain.md §7). The simulator has one idle level (load 0.01), so a spinning rank,
# whose clocks stay up, is put just above it: idle + 2% of the dynamic range (~83 W on an H100 that idles at 70 W).
SPIN_LOAD: Final = 0.02

# Signal levels of one training activity within a step: (sm_active, tensor_active, dram_active, power load).
Levels = tuple[float, float, float, float]


@dataclass(slots=True)
class Activity:
    """What one GPU is doing during one step, as ratios; the engine turns them into readings and adds noise."""

    utilization: float
    sm_active: float
    tensor_active: float
    dram_active: float
    load: float  # share of the dynamic power range, idle (0) to board power (1)
    nvlink: float  # share of the NVLink ceiling, per direction
    pcie_tx: float  # share of the current PCIe link ceiling
    pcie_rx: float
    memory_fraction: float
    busy: bool  # clocks up; False sets the idle throttle reason
    memory_jitter: bool  # allocator churn; False keeps memory exactly flat


def idle_activity(memory_fraction: float = 0.0) -> Activity:
    return Activity(0.0, 0.0, 0.0, 0.0, 0.01, 0.0, 2e-5, 2e-5, memory_fraction, False, False)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a job sits, as seen from one of its GPUs."""

    job: JobSpec
    local_gpus: int  # the job's GPUs on this GPU's node
    nodes: int  # nodes the job spans
    nvlink: bool  # this GPU's node has NVLink

    @property
    def nvlink_peers(self) -> bool:
        return self.nvlink and self.local_gpus >= 2


@dataclass(slots=True)
class JobPhase:
    """What a job is doing during one step.

    A fault that takes over a job's phase may set ``all_reduce`` and ``link_share`` (the training all-reduce's
    levels and NVLink share, instead of the healthy ones) or ``activity`` (what the phase does to each GPU).
    """

    mode: str
    comm_fraction: float = 0.0  # training: the part of the step spent in all-reduce
    intensity: float = 0.0  # inference and notebook: the load level; warm-up: the share of it done; starved:
    # the share of its cgroup CPU limit the job's input pipeline uses
    all_reduce: Levels | None = None
    link_share: float | None = None
    activity: Callable[[Placement], Activity] | None = None


@dataclass(frozen=True, slots=True)
class RankShare:
    """How a training rank splits a step: computing, in all-reduce, spinning in a collective while it waits.

    ``load_factor`` scales its power load, ``pace`` its traffic (a rank held back by a straggler moves less data).
    """

    compute: float
    comm: float
    spin: float
    load_factor: float = 1.0
    pace: float = 1.0


@dataclass(slots=True)
class GpuState:
    """One GPU during one step, before noise; faults adjust it in place while it is worked out."""

    activity: Activity
    jobs: tuple[JobSpec, ...]
    load: float  # share of the dynamic power range the work asks for
    power_limit_watts: float
    throttle: int
    pcie_generation: int
    pcie_width: int
    clock_share: float = 1.0  # of the max SM clock, while busy
    heat: str = "normal"  # "warm": near the slowdown threshold; "hot": at or above it
    profiling_dead: bool = False
    lost: bool = False
    missing: bool = False  # on the PCI bus, never opened by the driver: no reading at all (``gpu_missing``)
    power_watts: float = 0.0


@dataclass(slots=True)
class Counters:
    """A GPU's fault-driven counters at one time: what its faults have added since they began."""

    nvlink_crc: int = 0
    nvlink_replay: int = 0
    nvlink_recovery: int = 0
    pcie_replays: int = 0
    xids: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True)
class PortState:
    """One RDMA port during one step, before traffic; fabric fault kinds adjust it in place."""

    up: bool = True
    state: str = "ACTIVE"
    phys_state: str = "LinkUp"
    rate_share: float = 1.0  # of the port's own rate (a degraded link trains at half)
    link_width: int | None = None  # None: the port's own width
    congested: bool = False


@dataclass(slots=True)
class PortCounters:
    """A port's fault-driven error counters at one time: what its faults have added since they began."""

    symbol_errors: int = 0
    link_downed: int = 0
    link_error_recovery: int = 0
    receive_errors: int = 0
    local_link_integrity_errors: int = 0


@dataclass(slots=True)
class HostState:
    """A node's host during one step, before noise; host fault kinds adjust it in place."""

    memory_pressure: bool = False


@dataclass(slots=True)
class PlumbingState:
    """A node's plumbing during one step: the NVLink fabric and its manager (NVSwitch nodes) and the GPUDirect RDMA
    module (nodes with RDMA ports); plumbing fault kinds adjust it in place."""

    fabric_ready: bool = True  # nv-fabricmanager runs and has registered every GPU
    peermem_loaded: bool = True
