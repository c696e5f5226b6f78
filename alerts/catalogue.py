"""The builtin alert catalogue: each rule's contract name, severity, ``for``, thresholds, and what it means.

The names are a contract: the dashboard, the docs and users' routes and silences refer to them. Thresholds whose
name ends in ``_s`` are durations in seconds (the config accepts ``"10m"``); ``codes`` is a list of integers; every
other threshold is a number. ``docs/alerts.md`` explains each rule and what to do about it.
"""

from __future__ import annotations

from typing import Final

from gpulens.alerts import checks, detect, hostchecks, inefficient, promql, watchdog
from gpulens.alerts import prefilters as pre
from gpulens.alerts.base import AlertRule
from gpulens.alerts.definition import Definition, RoundPlan
from gpulens.alerts.fabriccatalogue import FABRIC_DEFINITIONS
from gpulens.alerts.hardwarecatalogue import HARDWARE_DEFINITIONS
from gpulens.alerts.hostcatalogue import HOST_DEFINITIONS
from gpulens.alerts.inspectorcatalogue import INSPECTOR_DEFINITIONS
from gpulens.alerts.names import (  # the rules' names, re-exported: the catalogue is where users look them up
    COMMUNICATION_STALL,
    ECC_UNCORRECTABLE,
    EXPORTER_DOWN,
    FABRIC_CONGESTION,
    FABRIC_SATURATED,
    GPU_CONFIG_DRIFT,
    GPU_DRIVER_HUNG,
    GPU_FABRIC_NOT_READY,
    GPU_LOST,
    GPU_MISSING,
    HW_POWER_BRAKE,
    IB_ERRORS,
    IB_LINK_DEGRADED,
    IB_LINK_DOWN,
    IB_LINK_FLAPPING,
    IB_PORT_MISSING,
    IB_PORT_SLOW,
    IDLE_ALLOCATED,
    JOB_COMMUNICATION_SLOW,
    JOB_INEFFICIENT,
    JOB_INPUT_BOUND,
    JOB_STRAGGLER,
    MEMORY_SATURATED,
    NVLINK_ERRORS,
    NVLINK_SATURATED,
    NVSWITCH_FATAL_SXID,
    PAGING_XIDS,
    PCIE_DEGRADED,
    PCIE_SATURATED,
    POWER_CAPPED,
    THERMAL_THROTTLING,
    WATCHDOG,
    XID_ERROR,
    XID_MEANINGS,
)
from gpulens.hardware import NVLINK_DEFAULT_LINK_BYTES_PER_SECOND

MINUTE: Final = 60.0

DEFINITIONS: Final[tuple[Definition, ...]] = (
    Definition(
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
        check=checks.memory_saturated,
        reads=("memory_used_bytes", "memory_total_bytes"),
        round=RoundPlan(fields=("memory_used_bytes",), here=pre.memory_here, facts=("memory_total_bytes",)),
        export=promql.memory_saturated,
    ),
    Definition(
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
        check=checks.thermal_throttling,
        reads=("temperature_celsius", "slowdown_temperature_celsius", "throttle_reasons"),
        round=RoundPlan(
            fields=("temperature_celsius",),
            here=pre.thermal_here,
            facts=("slowdown_temperature_celsius",),
            reasons=("hw_slowdown", "hw_thermal", "sw_thermal"),
        ),
        export=promql.thermal_throttling,
    ),
    Definition(
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
        check=checks.power_capped,
        reads=("power_watts", "power_limit_watts", "throttle_reasons", "utilization_ratio"),
        round=RoundPlan(here=pre.power_cap_here, reasons=("sw_power_cap",)),
        export=promql.power_capped,
    ),
    Definition(
        AlertRule(
            name=HW_POWER_BRAKE,
            severity="warning",
            for_s=0.0,
            keep_firing_for_s=5 * MINUTE,
            meaning="An external power-brake signal (power supply or chassis) forces the GPU's clocks down.",
            action="Check the node's power supplies and the chassis management log: a failing or missing PSU is the "
            "usual cause.",
        ),
        check=checks.hw_power_brake,
        reads=("throttle_reasons", "power_watts"),
        round=RoundPlan(here=pre.power_brake_here, reasons=("hw_power_brake",)),
        export=promql.hw_power_brake,
    ),
    Definition(
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
        check=checks.pcie_saturated,
        reads=(*pre.PCIE_TRAFFIC, "pcie_link_generation_max", "pcie_link_width_max"),
        round=RoundPlan(
            fields=pre.PCIE_TRAFFIC,
            here=pre.pcie_saturated_here,
            facts=("pcie_link_generation_max", "pcie_link_width_max"),
        ),
        export=promql.pcie_saturated,
    ),
    Definition(
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
        check=checks.nvlink_saturated,
        reads=(*pre.NVLINK_TRAFFIC, "nvlink_links_active"),
        round=RoundPlan(fields=(*pre.NVLINK_TRAFFIC, "nvlink_links_active"), here=pre.nvlink_saturated_here),
        export=promql.nvlink_saturated,
    ),
    Definition(
        AlertRule(
            name=PCIE_DEGRADED,
            severity="warning",
            for_s=MINUTE,
            thresholds={
                "busy_utilization": 0.1,
                "busy_traffic_ratio": 0.05,
                "replays_per_minute": 8.0,
                "window_s": 60.0,
            },
            meaning="The PCIe link trained below its maximum: fewer lanes than its maximum width (always a fault), or "
            "a lower generation while the GPU is busy (idle GPUs lower the generation to save power), or more than "
            "`replays_per_minute` link replays (the DCGM health limit).",
            action="Reseat the GPU or its riser, check the slot and cable; a link that keeps training down needs the "
            "board or the riser replaced.",
        ),
        check=checks.pcie_degraded,
        reads=(
            "pcie_link_generation",
            "pcie_link_generation_max",
            "pcie_link_width",
            "pcie_link_width_max",
            "pcie_replays_total",
            "utilization_ratio",
            *pre.PCIE_TRAFFIC,
        ),
        round=RoundPlan(fields=("pcie_replays_total",), promql=pre.pcie_below_max_filter, counters=checks.PCIE_REPLAYS),
        export=promql.pcie_degraded,
    ),
    Definition(
        AlertRule(
            name=NVLINK_ERRORS,
            severity="warning",
            for_s=MINUTE,
            thresholds={"crc_per_second": 100.0, "window_s": 60.0},
            meaning="NVLink CRC flit errors above `crc_per_second` (the DCGM health limit), or replay or recovery "
            "errors increasing, over the last `window_s`.",
            action="A bad NVLink lane or NVSwitch port: drain the node and run the vendor diagnostics (dcgmi diag -r "
            "3, nvidia-smi nvlink -e).",
        ),
        check=checks.nvlink_errors,
        reads=pre.NVLINK_ERROR_FIELDS,
        round=RoundPlan(fields=pre.NVLINK_ERROR_FIELDS, counters=checks.NVLINK_ERROR_COUNTERS),
        export=promql.nvlink_errors,
    ),
    Definition(
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
                "checkpoint_max_s": 15 * MINUTE,
                "checkpoint_factor": 2.0,
                "checkpoint_min_s": 3 * MINUTE,
            },
            meaning="A multi-GPU job hangs (an NCCL hang): NVLink and PCIe traffic fell below `quiet_ratio` of the "
            "job's own recent baseline on every GPU, and its GPUs show one of three signatures (the `signature` "
            "label): `spinning`, every GPU at ~100% utilization (at least `utilization_min`, a spinning kernel) with "
            "power below `power_ratio` of the baseline; `blocked`, every GPU idle (at most `idle_utilization_max`) "
            "with memory held (at least `memory_held_ratio` of the baseline); `mixed`, some spinning and cold, the "
            "others idle. `blocked` and `mixed` count only after the job has paused for `blocked_after_s` and for "
            "longer than any pause it came back from (checkpoints), and only for jobs whose baseline moved "
            "`blocked_baseline_traffic_min_bytes_per_second` per GPU. For a job on several nodes the alert also says "
            "what its NICs show (a port down, or down and up again within `fabric_window_s`, its traffic); a firing "
            "`IbLinkDown` or `IbLinkFlapping` on one of the job's ports marks it as the cause. Where the job's NCCL "
            "answers RAS queries, two more signatures name the ranks: `rank_missing`, a communicator's collective "
            "counts show the same mismatch for `ras_mismatch_for` (some ranks never launched the collective the "
            "others wait in; held back while every rank behind is busy, a checkpoint writer, for up to "
            "`checkpoint_max_s`, and in gpulens's engine for `checkpoint_factor` times the longest such save the job "
            "came back from, at least `checkpoint_min_s`), and `rank_dead`, RAS finds a "
            "rank's process dead (at once) or unresponsive (for `ras_mismatch_for`); either replaces the hardware "
            "signatures for that job. See 'How stall detection works'.",
            action="The job makes no progress: look at its logs for the rank that died or hangs (NCCL_DEBUG=INFO, "
            "py-spy dump), and at XidError/GpuLost alerts on its GPUs; restart it from its last checkpoint.",
        ),
        check=detect.communication_stall,
        reads=pre.JOB_FIELDS,
        round=RoundPlan(fields=pre.JOB_FIELDS, whole=False, reasons=pre.SLOWDOWN_REASONS, ports=True, nccl=True),
        export=promql.communication_stall,
    ),
    Definition(
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
        check=detect.job_straggler,
        reads=(*pre.JOB_FIELDS, "throttle_reasons"),
        round=RoundPlan(fields=pre.JOB_FIELDS, whole=False, reasons=pre.SLOWDOWN_REASONS),
        export=promql.job_straggler,
    ),
    Definition(
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
        check=checks.idle_allocated,
        reads=("utilization_ratio",),
        round=RoundPlan(fields=("utilization_ratio",), whole=False),
        export=promql.idle_allocated,
    ),
    Definition(
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
        check=inefficient.job_inefficient,
        reads=("utilization_ratio",),
        round=RoundPlan(fields=("utilization_ratio",), whole=False),
        gpulens_only="it counts a job's idle GPU readings over the rounds that list the job, which PromQL cannot "
        "bound per job",
    ),
    Definition(
        AlertRule(
            name=XID_ERROR,
            severity="critical",
            for_s=0.0,
            thresholds={"codes": tuple(float(c) for c in PAGING_XIDS), "window_s": 10 * MINUTE},
            meaning="The driver reported one of the XIDs in `codes` (the ones operators page on) within the last "
            "`window_s`.",
            action="Do what the alert's action says (the XID catalogue, docs/xid.md): check-application, reset-gpu, "
            "reboot or hardware-inspection; an XID that keeps coming back on one GPU across reboots escalates to "
            "hardware-inspection.",
        ),
        check=checks.xid_error,
        reads=("xid_errors",),
        round=RoundPlan(xids=True),
        export=promql.xid_error,
    ),
    Definition(
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
        check=checks.ecc_uncorrectable,
        reads=("ecc_uncorrected_errors_total", "remapped_rows_failure"),
        round=RoundPlan(
            fields=("ecc_uncorrected_errors_total",),
            promql=pre.remap_failed_filter,
            counters=checks.ECC_UNCORRECTED,
        ),
        export=promql.ecc_uncorrectable,
    ),
    Definition(
        AlertRule(
            name=GPU_LOST,
            severity="critical",
            for_s=0.0,
            meaning="The GPU no longer answers (NVML reports it lost; XID 79, fallen off the bus).",
            action="Drain the node; a reset or a reboot may bring the GPU back, a GPU that keeps falling off needs "
            "its board, riser or power checked.",
        ),
        check=checks.gpu_lost,
        reads=("up",),
        round=RoundPlan(whole=False),
        export=promql.gpu_lost,
    ),
    Definition(
        AlertRule(
            name=EXPORTER_DOWN,
            severity="critical",
            for_s=MINUTE,
            scope="node",
            meaning="The collector cannot scrape the node's exporter: the node, its exporter or the network is down. "
            "It mutes the node's other alerts, which keep their last state until the node answers again.",
            action="Check the node and the exporter service (systemctl status gpulens-exporter, its log).",
        ),
        check=checks.exporter_down,
        round=RoundPlan(whole=False),
        export=promql.exporter_down,
    ),
    Definition(
        AlertRule(
            name=GPU_DRIVER_HUNG,
            severity="critical",
            for_s=MINUTE,
            scope="node",
            meaning="An NVML call on the node has not returned within its deadline (5 s): the GPU driver is wedged. "
            "The exporter still answers (no ExporterDown): the node's other readings go on, its GPU readings are "
            "stale or withdrawn.",
            action="Drain the node and look at the kernel log (XIDs, NVRM messages); a wedged driver usually needs "
            "a GPU reset or a reboot.",
        ),
        check=hostchecks.gpu_driver_hung,
        round=RoundPlan(whole=False, hung=True),
        export=promql.gpu_driver_hung,
    ),
    *FABRIC_DEFINITIONS,
    *HOST_DEFINITIONS,
    *HARDWARE_DEFINITIONS,
    *INSPECTOR_DEFINITIONS,
    Definition(
        AlertRule(
            name=WATCHDOG,
            severity="none",
            for_s=0.0,
            meaning="Always firing while the alert engine runs: a dead-man's switch. Alertmanager (or a webhook's "
            "tool) pages when it stops arriving, that is when gpulens's alerting is down.",
            action="Nothing while it fires. Route it to a dead-man's-switch service (a heartbeat check that pages when "
            "the alert stops), never to people.",
        ),
        check=watchdog.watchdog,
        round=RoundPlan(whole=False),
        export=promql.watchdog,
    ),
)

__all__ = [
    "BUILTIN_NAMES",
    "BUILTIN_RULES",
    "COMMUNICATION_STALL",
    "DEFINITIONS",
    "ECC_UNCORRECTABLE",
    "EXPORTER_DOWN",
    "FABRIC_CONGESTION",
    "FABRIC_SATURATED",
    "GPULENS_ONLY",
    "GPU_CONFIG_DRIFT",
    "GPU_DRIVER_HUNG",
    "GPU_FABRIC_NOT_READY",
    "GPU_LOST",
    "GPU_MISSING",
    "HW_POWER_BRAKE",
    "IB_ERRORS",
    "IB_LINK_DEGRADED",
    "IB_LINK_DOWN",
    "IB_LINK_FLAPPING",
    "IB_PORT_MISSING",
    "IB_PORT_SLOW",
    "IDLE_ALLOCATED",
    "JOB_COMMUNICATION_SLOW",
    "JOB_INEFFICIENT",
    "JOB_INPUT_BOUND",
    "JOB_STRAGGLER",
    "MEMORY_SATURATED",
    "NVLINK_ERRORS",
    "NVLINK_SATURATED",
    "NVSWITCH_FATAL_SXID",
    "PAGING_XIDS",
    "PCIE_DEGRADED",
    "PCIE_SATURATED",
    "POWER_CAPPED",
    "THERMAL_THROTTLING",
    "WATCHDOG",
    "XID_ERROR",
    "XID_MEANINGS",
    "definition",
]

BUILTIN_RULES: Final[tuple[AlertRule, ...]] = tuple(d.rule for d in DEFINITIONS)
BUILTIN_NAMES: Final = tuple(rule.name for rule in BUILTIN_RULES)
_BY_NAME: Final = {d.rule.name: d for d in DEFINITIONS}
# The rules PromQL cannot say, and why (``gpulens rules export`` names them in a comment; docs/prometheus-alerts.md)
GPULENS_ONLY: Final = {d.rule.name: d.gpulens_only for d in DEFINITIONS if d.gpulens_only}


def definition(rule: AlertRule) -> Definition | None:
    """The catalogue's entry of ``rule`` (a builtin as configured, by its check's name), None for a user rule."""
    return _BY_NAME.get(rule.check or rule.name)
