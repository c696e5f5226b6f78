"""The builtin alert catalogue: each rule's contract name, severity, ``for``, thresholds, and what it means.

The names are a contract: the dashboard, the docs and users' routes and silences refer to them. Thresholds whose
name ends in ``_s`` are durations in seconds (the config accepts ``"10m"``); ``codes`` is a list of integers; every
other threshold is a number. ``docs/alerts.md`` explains each rule and what to do about it.
"""

from __future__ import annotations

from typing import Final

from gpulens.alerts.base import AlertRule
from gpulens.alerts.fabriccatalogue import (
    FABRIC_CONGESTION,
    FABRIC_RULES,
    FABRIC_SATURATED,
    IB_ERRORS,
    IB_LINK_DEGRADED,
    IB_LINK_DOWN,
    IB_LINK_FLAPPING,
    JOB_INPUT_BOUND,
)
from gpulens.hardware import NVLINK_DEFAULT_LINK_BYTES_PER_SECOND

MEMORY_SATURATED: Final = "GpuMemorySaturated"
THERMAL_THROTTLING: Final = "GpuThermalThrottling"
POWER_CAPPED: Final = "GpuPowerCapped"
HW_POWER_BRAKE: Final = "GpuHwPowerBrake"
PCIE_SATURATED: Final = "PcieBandwidthSaturated"
NVLINK_SATURATED: Final = "NvlinkBandwidthSaturated"
PCIE_DEGRADED: Final = "PcieLinkDegraded"
NVLINK_ERRORS: Final = "NvlinkErrors"
COMMUNICATION_STALL: Final = "CommunicationStall"
JOB_STRAGGLER: Final = "JobStraggler"
IDLE_ALLOCATED: Final = "GpuIdleAllocated"
JOB_INEFFICIENT: Final = "JobInefficient"
XID_ERROR: Final = "XidError"
ECC_UNCORRECTABLE: Final = "EccUncorrectable"
GPU_LOST: Final = "GpuLost"
EXPORTER_DOWN: Final = "ExporterDown"
WATCHDOG: Final = "Watchdog"

# The XIDs operators page on (docs/domain.md §4) and what each means.
PAGING_XIDS: Final = (48, 62, 64, 74, 79, 94, 95, 119, 120)
XID_MEANINGS: Final = {
    48: "double-bit ECC error",
    62: "internal micro-controller halt",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}

MINUTE: Final = 60.0

BUILTIN_RULES: Final[tuple[AlertRule, ...]] = (
    AlertRule(
        name=MEMORY_SATURATED,
        severity="warning",
        for_s=5 * MINUTE,
        keep_firing_for_s=MINUTE,
        thresholds={"used_ratio": 0.95},
        meaning="GPU memory in use is at or above `used_ratio` of the total, sustained: the next allocation may "
        "fail with an out-of-memory error, or a process is leaking memory.",
        action="Look at the GPU's processes on the dashboard; a steady climb is a leak in the job, a flat line "
        "near the top is a job sized to the edge (inference servers preallocate ~90% on purpose).",
    ),
    AlertRule(
        name=THERMAL_THROTTLING,
        severity="warning",
        for_s=MINUTE,
        thresholds={"margin_celsius": 0.0},
        meaning="The GPU slows its clocks for heat: its temperature is at its slowdown threshold (less "
        "`margin_celsius`), or NVML reports a software or hardware thermal slowdown.",
        action="Check the node's cooling (fans, airflow, inlet temperature, liquid loop); one hot GPU among cool "
        "peers points at its heatsink or thermal paste. In a synchronous job it also slows every other rank.",
    ),
    AlertRule(
        name=POWER_CAPPED,
        severity="info",
        for_s=5 * MINUTE,
        thresholds={"power_ratio": 0.95, "busy_utilization": 0.5},
        meaning="The GPU runs at its enforced power limit (at least `power_ratio` of it) with the SW_POWER_CAP "
        "clock reason set: its work asks for more power than it may draw. Short pauses in the work (utilization "
        "below `busy_utilization`) neither count nor reset the `for` timer.",
        action="Normal for power-bound work at the full board limit; worth a look when the limit was lowered "
        "(nvidia-smi -pl, a datacenter power policy) or only one GPU of a job is capped.",
    ),
    AlertRule(
        name=HW_POWER_BRAKE,
        severity="warning",
        for_s=0.0,
        keep_firing_for_s=5 * MINUTE,
        meaning="An external power-brake signal (power supply or chassis) forces the GPU's clocks down.",
        action="Check the node's power supplies and the chassis management log: a failing or missing PSU is the "
        "usual cause.",
    ),
    AlertRule(
        name=PCIE_SATURATED,
        severity="warning",
        for_s=2 * MINUTE,
        keep_firing_for_s=MINUTE,
        thresholds={"utilization_ratio": 0.8},
        meaning="PCIe throughput in one direction is at least `utilization_ratio` of the link's maximum (per-lane "
        "rate of its maximum generation x its maximum width), sustained: host transfers are the bottleneck.",
        action="Look for host-device copies in the job (data loading, CPU offload, checkpoints); pinned memory, "
        "overlapping copies or GPUDirect can help.",
    ),
    AlertRule(
        name=NVLINK_SATURATED,
        severity="warning",
        for_s=2 * MINUTE,
        keep_firing_for_s=MINUTE,
        thresholds={"utilization_ratio": 0.85, "link_bytes_per_second": NVLINK_DEFAULT_LINK_BYTES_PER_SECOND},
        meaning="NVLink throughput in one direction is at least `utilization_ratio` of the active links' maximum "
        "(active links x `link_bytes_per_second`, 25 GB/s per link and direction on A100, H100 and H200; use 50e9 "
        "for NVLink 5), sustained: the job's collectives are bandwidth-bound.",
        action="Usually a property of the job (large all-reduce, tensor parallelism across GPUs); consider "
        "gradient compression, overlap or a different parallel layout.",
    ),
    AlertRule(
        name=PCIE_DEGRADED,
        severity="warning",
        for_s=MINUTE,
        thresholds={"busy_utilization": 0.1, "busy_traffic_ratio": 0.05, "replays_per_minute": 8.0, "window_s": 60.0},
        meaning="The PCIe link trained below its maximum: fewer lanes than its maximum width (always a fault), or "
        "a lower generation while the GPU is busy (idle GPUs lower the generation to save power), or more than "
        "`replays_per_minute` link replays (the DCGM health limit).",
        action="Reseat the GPU or its riser, check the slot and cable; a link that keeps training down needs the "
        "board or the riser replaced.",
    ),
    AlertRule(
        name=NVLINK_ERRORS,
        severity="warning",
        for_s=MINUTE,
        thresholds={"crc_per_second": 100.0, "window_s": 60.0},
        meaning="NVLink CRC flit errors above `crc_per_second` (the DCGM health limit), or replay or recovery "
        "errors increasing, over the last `window_s`.",
        action="A bad NVLink lane or NVSwitch port: drain the node and run the vendor diagnostics (dcgmi diag -r 3, "
        "nvidia-smi nvlink -e).",
    ),
    AlertRule(
        name=COMMUNICATION_STALL,
        severity="critical",
        for_s=5 * MINUTE,
        scope="job",
        thresholds={
            "utilization_min": 0.9,
            "quiet_ratio": 0.05,
            "power_ratio": 0.6,
            "sm_active_ratio": 0.3,
            "baseline_traffic_min_bytes_per_second": 500e6,
            "baseline_rounds_min": 6.0,
            "idle_utilization_max": 0.05,
            "memory_held_ratio": 0.5,
            "blocked_after_s": 11 * MINUTE,
            "blocked_baseline_traffic_min_bytes_per_second": 3e9,
            "fabric_window_s": 10 * MINUTE,
            "ras_mismatch_for": 30.0,
        },
        meaning="A multi-GPU job hangs (an NCCL hang): NVLink and PCIe traffic fell below `quiet_ratio` of the "
        "job's own recent baseline on every GPU, and its GPUs show one of three signatures (the `signature` label): "
        "`spinning`, every GPU at ~100% utilization (at least `utilization_min`, a spinning kernel) with power below "
        "`power_ratio` of the baseline; `blocked`, every GPU idle (at most `idle_utilization_max`) with memory held "
        "(at least `memory_held_ratio` of the baseline); `mixed`, some spinning and cold, the others idle. `blocked` "
        "and `mixed` count only after the job has paused for `blocked_after_s` and for longer than any pause it came "
        "back from (checkpoints), and only for jobs whose baseline moved "
        "`blocked_baseline_traffic_min_bytes_per_second` per GPU. For a job on several nodes the alert also says "
        "what its NICs show (a port down, or down and up again within `fabric_window_s`, its traffic); a firing "
        "`IbLinkDown` or `IbLinkFlapping` on one of the job's ports marks it as the cause. Where the job's NCCL "
        "answers RAS queries, two more signatures name the ranks: `rank_missing`, a communicator's collective counts "
        "show the same mismatch for `ras_mismatch_for` (some ranks never launched the collective the others wait "
        "in), and `rank_dead`, RAS finds a rank's process dead (at once) or unresponsive (for `ras_mismatch_for`); "
        "either replaces the hardware signatures for that job. See 'How stall detection works'.",
        action="The job makes no progress: look at its logs for the rank that died or hangs (NCCL_DEBUG=INFO, "
        "py-spy dump), and at XidError/GpuLost alerts on its GPUs; restart it from its last checkpoint.",
    ),
    AlertRule(
        name=JOB_STRAGGLER,
        severity="warning",
        for_s=3 * MINUTE,
        keep_firing_for_s=MINUTE,
        scope="job",
        thresholds={
            "busy_utilization": 0.5,
            "clock_ratio": 0.9,
            "power_difference": 0.05,
            "peer_power_ratio": 0.9,
            "baseline_rounds_min": 6.0,
        },
        meaning="One GPU of a multi-GPU job holds the others back: its SM clock is below `clock_ratio` of its "
        "peers' median or it alone has a throttle reason, its power differs from the peers' median by "
        "`power_difference` or more, and the peers wait (their power fell below `peer_power_ratio` of the job's "
        "baseline). See 'How straggler detection works'.",
        action="Look at the slow GPU's temperature, power limit and PCIe link; move the job off it or fix its "
        "cooling. The whole job runs at the straggler's pace.",
    ),
    AlertRule(
        name=IDLE_ALLOCATED,
        severity="info",
        for_s=30 * MINUTE,
        thresholds={"utilization_max": 0.15},
        meaning="A GPU allocated to a job has stayed below `utilization_max` utilization (the jobstats "
        "threshold) for the whole `for` duration: it is reserved but unused.",
        action="Ask the job's user whether it still needs the GPU; idle interactive sessions and forgotten jobs "
        "are the usual cause.",
    ),
    AlertRule(
        name=JOB_INEFFICIENT,
        severity="info",
        for_s=30 * MINUTE,
        scope="job",
        thresholds={"idle_utilization": 0.05, "idle_ratio": 0.8},
        meaning="A job's GPUs were below `idle_utilization` utilization in at least `idle_ratio` of their readings "
        "over the history's window, for the whole `for` duration: it holds GPUs it mostly leaves idle (its "
        "accounting summary gives the same share over its whole life).",
        action="Tell the job's user: ask for fewer GPUs, or fix the input pipeline or the code that leaves them "
        "waiting; `gpulens job-summary JOB_ID` shows what the job held and used.",
    ),
    AlertRule(
        name=XID_ERROR,
        severity="critical",
        for_s=0.0,
        thresholds={"codes": tuple(float(c) for c in PAGING_XIDS), "window_s": 10 * MINUTE},
        meaning="The driver reported one of the XIDs in `codes` (the ones operators page on) within the last "
        "`window_s`.",
        action="Look the XID up in NVIDIA's XID catalogue; most of these need the GPU drained and reset, and "
        "repeated ones an RMA.",
    ),
    AlertRule(
        name=ECC_UNCORRECTABLE,
        severity="critical",
        for_s=0.0,
        thresholds={"window_s": 10 * MINUTE},
        meaning="Uncorrectable ECC errors increased within `window_s`, or a row remapping failed: the GPU's "
        "memory returned corrupt data.",
        action="Drain the GPU; a row-remap failure or repeated uncorrectable errors mean an RMA. Jobs that ran on "
        "it may have computed with corrupt data.",
    ),
    AlertRule(
        name=GPU_LOST,
        severity="critical",
        for_s=0.0,
        meaning="The GPU no longer answers (NVML reports it lost; XID 79, fallen off the bus).",
        action="Drain the node; a reset or a reboot may bring the GPU back, a GPU that keeps falling off needs "
        "its board, riser or power checked.",
    ),
    AlertRule(
        name=EXPORTER_DOWN,
        severity="critical",
        for_s=MINUTE,
        scope="node",
        meaning="The collector cannot scrape the node's exporter: the node, its exporter or the network is down. "
        "It mutes the node's other alerts, which keep their last state until the node answers again.",
        action="Check the node and the exporter service (systemctl status gpulens-exporter, its log).",
    ),
    *FABRIC_RULES,
    AlertRule(
        name=WATCHDOG,
        severity="none",
        for_s=0.0,
        meaning="Always firing while the alert engine runs: a dead-man's switch. Alertmanager (or a webhook's "
        "tool) pages when it stops arriving, that is when gpulens's alerting is down.",
        action="Nothing while it fires. Route it to a dead-man's-switch service (a heartbeat check that pages when "
        "the alert stops), never to people.",
    ),
)

__all__ = [
    "BUILTIN_NAMES",
    "BUILTIN_RULES",
    "FABRIC_CONGESTION",
    "FABRIC_SATURATED",
    "IB_ERRORS",
    "IB_LINK_DEGRADED",
    "IB_LINK_DOWN",
    "IB_LINK_FLAPPING",
    "JOB_INPUT_BOUND",
    "WATCHDOG",
]

BUILTIN_NAMES: Final = tuple(rule.name for rule in BUILTIN_RULES)
