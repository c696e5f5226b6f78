"""The record types that flow from a source to the exporter, the collector, storage and the UI.

Units are converted once, at the source: bytes, seconds, watts, degrees Celsius, hertz and 0-1 ratios.
A value that could not be read is ``None`` and its series is omitted downstream; never NaN or -1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from gpulens.fabricmodel import HostReading, JobHostReading, NicReading
from gpulens.kernelmodel import KernelView
from gpulens.ncclinspect import InspectorView
from gpulens.ncclmodel import NcclView
from gpulens.nodehardware import NodeHardware

# Clock-event ("throttle") reason bits, as NVML defines them (nvmlClocksEventReason*).
THROTTLE_REASONS: Final[tuple[tuple[str, int], ...]] = (
    ("idle", 0x1),
    ("applications_clocks", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal", 0x20),
    ("hw_thermal", 0x40),
    ("hw_power_brake", 0x80),
    ("display_clocks", 0x100),
)
THROTTLE_MASK: Final = sum(bit for _, bit in THROTTLE_REASONS)
# Where a reading's throttle reasons came from (``GpuReading.throttle_reasons_source``): the driver's clock-event
# reasons (NVML, DCGM field 112, dcgm-exporter's clock-event counts); a rise of DCGM's ``*_VIOLATION`` time counters;
# or inferred from the SM clock against its maximum with temperature and power against their limits.
THROTTLE_REPORTED: Final = "reported"
THROTTLE_VIOLATION: Final = "violation"
THROTTLE_INFERRED: Final = "inferred"
THROTTLE_SOURCES: Final = (THROTTLE_REPORTED, THROTTLE_VIOLATION, THROTTLE_INFERRED)
# What a snapshot's ``links`` holds (``NodeSnapshot.links_scope``).
LINKS_ALL: Final = "all"
LINKS_INACTIVE: Final = "inactive"
LINK_SCOPES: Final = (LINKS_ALL, LINKS_INACTIVE)


def throttle_reason_names(mask: int) -> list[str]:
    """The names of the reasons set in an NVML clock-event bitmask."""
    return [name for name, bit in THROTTLE_REASONS if mask & bit]


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU at one instant. Every optional field is ``None`` when the source cannot read it."""

    node: str
    gpu: int
    uuid: str
    model: str
    timestamp: float
    up: bool = True
    pci_bus_id: str | None = None
    driver_version: str | None = None
    mig_enabled: bool | None = None
    utilization_ratio: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    temperature_celsius: float | None = None
    memory_temperature_celsius: float | None = None
    slowdown_temperature_celsius: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules_total: float | None = None
    sm_clock_hertz: float | None = None
    memory_clock_hertz: float | None = None
    max_sm_clock_hertz: float | None = None
    max_memory_clock_hertz: float | None = None
    throttle_reasons: int | None = None
    throttle_reasons_source: str | None = None  # one of THROTTLE_SOURCES; None (with reasons known): reported
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    pcie_link_generation: int | None = None
    pcie_link_generation_max: int | None = None
    pcie_link_width: int | None = None
    pcie_link_width_max: int | None = None
    pcie_replays_total: int | None = None
    nvlink_tx_bytes_per_second: float | None = None
    nvlink_rx_bytes_per_second: float | None = None
    nvlink_links_active: int | None = None
    nvlink_crc_flit_errors_total: int | None = None
    nvlink_replay_errors_total: int | None = None
    nvlink_recovery_errors_total: int | None = None
    ecc_corrected_errors_total: int | None = None
    ecc_uncorrected_errors_total: int | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    sm_active_ratio: float | None = None
    tensor_active_ratio: float | None = None
    dram_active_ratio: float | None = None
    encoder_utilization_ratio: float | None = None
    decoder_utilization_ratio: float | None = None
    sm_occupancy_ratio: float | None = None
    fp64_active_ratio: float | None = None
    fp32_active_ratio: float | None = None
    fp16_active_ratio: float | None = None
    # Time the clocks were held down by each DCGM violation policy, since the driver loaded (counters).
    power_violation_seconds_total: float | None = None
    thermal_violation_seconds_total: float | None = None
    sync_boost_violation_seconds_total: float | None = None
    board_limit_violation_seconds_total: float | None = None
    low_utilization_violation_seconds_total: float | None = None
    reliability_violation_seconds_total: float | None = None
    # Persistent (aggregate, over the GPU's life) ECC errors, and pre-Ampere page retirement.
    ecc_corrected_errors_persistent_total: int | None = None
    ecc_uncorrected_errors_persistent_total: int | None = None
    retired_pages_single_bit_total: int | None = None
    retired_pages_double_bit_total: int | None = None
    retired_pages_pending: bool | None = None
    nvlink_crc_data_errors_total: int | None = None
    # dcgm-exporter's own series: the worst DCGM health-watch result (0 pass, 1 warn, 2 fail) and the peer GPUs
    # this GPU reaches peer-to-peer (DCGM_EXP_P2P_STATUS "OK").
    health_status: int | None = None
    p2p_peers_ok: int | None = None
    # XID code -> number of events seen since the source started (a counter per code).
    xid_errors: Mapping[int, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LinkReading:
    """One NVLink of one GPU."""

    node: str
    gpu: int
    uuid: str
    link: int
    active: bool
    tx_bytes_per_second: float | None = None
    rx_bytes_per_second: float | None = None
    remote_pci_bus_id: str | None = None


@dataclass(frozen=True, slots=True)
class ProcessReading:
    """A compute process on a GPU, with the job and user it belongs to when known."""

    node: str
    gpu: int
    uuid: str
    pid: int
    memory_used_bytes: int | None = None
    command: str | None = None
    user: str | None = None
    job_id: str | None = None


@dataclass(frozen=True, slots=True)
class GpuJob:
    """A job (Slurm job, Kubernetes pod, container, ...) that holds a GPU."""

    node: str
    gpu: int
    uuid: str
    job_id: str
    user: str | None = None
    mig_uuid: str | None = None  # the MIG instance (MigReading.mig_uuid) the job runs on, when known
    # A Kubernetes pod (the kubelet's pod-resources API): job_id is "<namespace>/<pod>"; pod_uid from its cgroup.
    namespace: str | None = None
    pod: str | None = None
    container: str | None = None
    pod_uid: str | None = None


@dataclass(frozen=True, slots=True)
class JobInfo:
    """What the scheduler says of a job holding one of the node's GPUs (Slurm's ``squeue``); times in Unix seconds."""

    node: str
    job_id: str
    name: str | None = None
    user: str | None = None
    account: str | None = None
    partition: str | None = None
    array_job_id: str | None = None
    array_task_id: int | None = None
    submit_time: float | None = None
    start_time: float | None = None


@dataclass(frozen=True, slots=True)
class MigReading:
    """One MIG device (GPU instance) of a MIG-enabled GPU."""

    node: str
    gpu: int
    uuid: str
    mig_uuid: str
    gpu_instance_id: int
    compute_instance_id: int | None = None
    profile: str | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """Everything one source read from one node in one collection."""

    node: str
    timestamp: float
    source: str
    gpus: tuple[GpuReading, ...] = ()
    links: tuple[LinkReading, ...] = ()
    processes: tuple[ProcessReading, ...] = ()
    jobs: tuple[GpuJob, ...] = ()
    migs: tuple[MigReading, ...] = ()
    # The scheduler's metadata for the jobs in ``jobs``, where a scheduler was asked (``--job-info``).
    job_info: tuple[JobInfo, ...] = ()
    driver_version: str | None = None
    # The node's RDMA ports (InfiniBand / RoCE), its host CPUs and memory, and each job's share of the host;
    # empty / None where the source does not read them (dcgm-exporter pages, fabric reading off).
    nics: tuple[NicReading, ...] = ()
    host: HostReading | None = None
    job_hosts: tuple[JobHostReading, ...] = ()
    # Cumulative counts of the source's own failures by reason (e.g. "nvml_not_supported").
    errors: Mapping[str, int] = field(default_factory=dict)
    # Which links ``links`` holds: every link the source read (LINKS_ALL), or only the inactive ones (LINKS_INACTIVE,
    # what the collector asks an exporter for: then every link not listed is up on a GPU whose
    # ``nvlink_links_active`` is known).
    links_scope: str = LINKS_ALL
    # GPU uuid -> quantity ("pcie", "nvlink", "profiling") -> where its values came from ("gpm", "sample",
    # "counters"); set by the NVML source, exported as gpulens_gpu_metric_source_info (not in the JSON document).
    metric_sources: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # NCCL's own view of the jobs on this node (NCCL RAS); None where RAS is not read or nothing answered yet.
    nccl: NcclView | None = None
    # The NCCL Inspector's bus bandwidth and collective time per job and communicator (``--nccl-inspector-dir``);
    # None where the Inspector's files are not read.
    inspector: InspectorView | None = None
    # The kernel log's Xids on unknown addresses, NVSwitch SXids and each GPU's XID actions; None where the
    # exporter keeps no XID ledger (exported in /metrics, not in the JSON document).
    kernel: KernelView | None = None
    # The node's hardware against what it should be (GPUs on the PCI bus, fabric, plumbing, GPU settings); None
    # where the source does not read it (dcgm-exporter pages, an agent before 0.x).
    hardware: NodeHardware | None = None
    # The parts of this snapshot that are late, by reader ("gpus", "pods", "fabric"), with the seconds since that
    # reader last succeeded; a late "gpus" part is withdrawn from the snapshot document (docs/exporter.md).
    stale: Mapping[str, float] = field(default_factory=dict)
    # When (Unix seconds) an NVML call of this node passed its deadline: the driver is hung (GpuDriverHung);
    # None while NVML answers, or where the source is not NVML.
    nvml_hung_since: float | None = None

    def replace(self, **changes: Any) -> NodeSnapshot:
        return dataclasses.replace(self, **changes)

    def inactive_links(self) -> NodeSnapshot:
        """The snapshot with only its inactive links (``LINKS_INACTIVE``): what a collector needs of ~150 links."""
        if self.links_scope == LINKS_INACTIVE:
            return self
        return dataclasses.replace(self, links=tuple(x for x in self.links if not x.active), links_scope=LINKS_INACTIVE)


class GpuSource(Protocol):
    """What every source (NVML, dcgm-exporter, simulator) implements."""

    def read(self) -> NodeSnapshot:
        """Read the node now. Raises ``SourceError`` only when nothing at all can be read."""
        ...

    def close(self) -> None: ...


class MultiNodeSource(Protocol):
    """A source that stands in for many nodes (the simulator's ``--all-nodes``)."""

    def node_names(self) -> list[str]: ...

    def read_node(self, node: str) -> NodeSnapshot: ...

    def close(self) -> None: ...


class SourceError(Exception):
    """A source failed as a whole (NVML missing, dcgm-exporter unreachable, ...)."""


class SnapshotFormatError(ValueError):
    """A snapshot document does not follow schema 1 or 2 (read by ``gpulens.snapshotcodec``)."""


class NodeUnavailableError(SourceError):
    """The node's exporter cannot answer at all (the simulator's ``exporter_down`` fault); served as HTTP 503."""


@dataclass(frozen=True, slots=True)
class TargetHealth:
    """The outcome of one scrape of one target by the collector."""

    target: str  # the target's name (its base URL unless configured otherwise)
    url: str  # the URL scraped, with any credentials redacted
    kind: str  # "gpulens" | "dcgm"
    timestamp: float
    up: bool
    node: str | None = None
    scrape_duration_seconds: float | None = None
    samples: int = 0  # GPU readings accepted from this scrape
    rejected: int = 0  # readings or lines rejected from this scrape
    last_error: str | None = None
