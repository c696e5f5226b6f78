"""The builtin fabric and host rules of the catalogue: InfiniBand/RoCE ports, and jobs starved by their host.

Part of ``alerts.catalogue`` (which lists them after the GPU rules); the same conventions hold: ``_s`` thresholds are
durations in seconds, the others numbers. Every port alert carries ``node``, ``device``, ``port``, ``gpus`` (the
port's nearest GPUs) and, when a job holds those GPUs, ``job`` and ``job_id``. ``docs/alerts.md`` explains each.
"""

from __future__ import annotations

from typing import Final

from gpulens.alerts import fabricchecks, hostchecks, promql
from gpulens.alerts.base import AlertRule
from gpulens.alerts.definition import Definition, RoundPlan
from gpulens.alerts.names import (
    FABRIC_CONGESTION,
    FABRIC_SATURATED,
    IB_ERRORS,
    IB_LINK_DEGRADED,
    IB_LINK_DOWN,
    IB_LINK_FLAPPING,
    JOB_INPUT_BOUND,
)
from gpulens.alerts.prefilters import JOB_FIELDS, SLOWDOWN_REASONS

MINUTE: Final = 60.0

FABRIC_DEFINITIONS: Final[tuple[Definition, ...]] = (
    Definition(
        AlertRule(
            name=IB_LINK_DOWN,
            severity="critical",
            for_s=MINUTE,
            meaning="An InfiniBand or RoCE port that was up (or has gone down before: its link_downed counter is not "
            "zero) is not ACTIVE/LinkUp. Ports disabled on purpose (physical state Disabled) and ports never seen up "
            "are left alone. A job using the port's GPUs loses that rail; NCCL usually hangs rather than fails.",
            action="Check the cable, the transceiver and the switch port (ibstat, ibportstate, the switch's log); "
            "restart the job's stalled ranks once the link is back.",
        ),
        check=fabricchecks.ib_link_down,
        round=RoundPlan(whole=False, ports=True),
        export=promql.ib_link_down,
    ),
    Definition(
        AlertRule(
            name=IB_LINK_FLAPPING,
            severity="warning",
            for_s=0.0,
            keep_firing_for_s=5 * MINUTE,
            thresholds={"flaps_max": 2.0, "window_s": 15 * MINUTE},
            meaning="The port went down more than `flaps_max` times within `window_s` (its link_downed counter, or "
            "down rounds seen when the counter is not read). Each flap stalls the collectives crossing it; periodic "
            "tests pass between flaps.",
            action="A marginal cable, transceiver or switch port: reseat or replace it, and look at the symbol errors "
            "of both ends (IbErrors).",
        ),
        check=fabricchecks.ib_link_flapping,
        round=RoundPlan(whole=False, ports=True),
        export=promql.ib_link_flapping,
    ),
    Definition(
        AlertRule(
            name=IB_LINK_DEGRADED,
            severity="warning",
            for_s=2 * MINUTE,
            thresholds={"peer_rate_ratio": 0.75},
            meaning="The port is up below its maximum: its rate or width is below the highest it ran at since the "
            "collector started, or its rate is below `peer_rate_ratio` of the median rate of the node's other up ports "
            "of the same link layer (a port at half its peers' rate). Every collective crossing it runs at its pace.",
            action="A lane is down or the link trained at a lower speed: reseat or replace the cable or transceiver, "
            "then reset the port (the link retrains at its full rate only after a reset).",
        ),
        check=fabricchecks.ib_link_degraded,
        round=RoundPlan(whole=False, ports=True),
        export=promql.ib_link_degraded,
    ),
    Definition(
        AlertRule(
            name=IB_ERRORS,
            severity="warning",
            for_s=MINUTE,
            thresholds={
                "symbol_errors_max": 10.0,
                "link_integrity_errors_max": 0.0,
                "receive_errors_max": 10.0,
                "window_s": 10 * MINUTE,
            },
            meaning="Physical-layer errors on the port increased within `window_s`: symbol errors above "
            "`symbol_errors_max`, local link integrity errors above `link_integrity_errors_max` or receive errors "
            "above `receive_errors_max`. A link with climbing errors retransmits and is the next to flap or go down.",
            action="Clean or replace the cable or transceiver; compare with the switch side's counters (perfquery) to "
            "tell which end is bad.",
        ),
        check=fabricchecks.ib_errors,
        round=RoundPlan(whole=False, ports=True),
        export=promql.ib_errors,
    ),
    Definition(
        AlertRule(
            name=FABRIC_CONGESTION,
            severity="warning",
            for_s=3 * MINUTE,
            keep_firing_for_s=MINUTE,
            thresholds={
                "wait_ratio": 10.0,
                "wait_min_per_second": 1e6,
                "cnp_ratio": 10.0,
                "cnp_min_per_second": 1000.0,
                "traffic_ratio_max": 0.8,
            },
            meaning="The port waits to send (transmit-wait ticks per second) or is told to slow down (RoCE CNPs "
            "handled per second) at least `wait_ratio` (`cnp_ratio`) times its own usual level and above "
            "`wait_min_per_second` (`cnp_min_per_second`), while its traffic stays below `traffic_ratio_max` of its "
            "rate: the fabric beyond the port is congested, not the port busy. The usual level is the median of its "
            "recent uncongested rounds.",
            action="Look for other jobs sharing the switches (the job's steps slow together with theirs), a bad "
            "adaptive-routing or ECN/PFC setting, or an oversubscribed uplink.",
        ),
        check=fabricchecks.fabric_congestion,
        round=RoundPlan(whole=False, ports=True),
        export=promql.fabric_congestion,
    ),
    Definition(
        AlertRule(
            name=FABRIC_SATURATED,
            severity="warning",
            for_s=5 * MINUTE,
            keep_firing_for_s=MINUTE,
            thresholds={"utilization_ratio": 0.9},
            meaning="The port's traffic in one direction is at least `utilization_ratio` of its rate, sustained: the "
            "inter-node link is the job's bottleneck. Short bursts (a checkpoint written to network storage) are "
            "shorter than `for`; a port running below its own highest rate is left to IbLinkDegraded.",
            action="Usually a property of the job (data-parallel all-reduce across nodes); more rails, gradient "
            "compression or a layout with less inter-node traffic help.",
        ),
        check=fabricchecks.fabric_saturated,
        round=RoundPlan(whole=False, ports=True),
        export=promql.fabric_saturated,
    ),
    Definition(
        AlertRule(
            name=JOB_INPUT_BOUND,
            severity="warning",
            for_s=5 * MINUTE,
            scope="job",
            thresholds={
                "utilization_max": 0.4,
                "cpu_saturated_ratio": 0.9,
                "iowait_ratio": 0.3,
                "memory_available_ratio_min": 0.05,
                "checkpoint_write_bytes_per_second": 100e6,
            },
            meaning="The job's GPUs are mostly idle (median utilization at most `utilization_max`, in a job that had "
            "been busy) while its host starves it: on one of its nodes its cgroup uses at least `cpu_saturated_ratio` "
            "of its CPU limit (of the node's CPUs when it has none), or the node's iowait is at least `iowait_ratio` "
            "(with available memory below `memory_available_ratio_min` this is memory pressure). A checkpoint is not "
            "input-bound: while the job's NICs (or GPUs over PCIe) write at least `checkpoint_write_bytes_per_second` "
            "and more than they read, the rule holds its judgement.",
            action="Give the data loader more CPU (workers, cgroup limit) or move its preprocessing to the GPU; for "
            "memory pressure, lower the host memory the job pins (page cache, pinned buffers) or its batch prefetch.",
        ),
        check=hostchecks.job_input_bound,
        round=RoundPlan(fields=JOB_FIELDS, whole=False, reasons=SLOWDOWN_REASONS, ports=True, hosts=True),
        gpulens_only="it needs each job's cgroup CPU limit beside its GPUs' idle share and a checkpoint's "
        "writes, which the exported families do not join (the job CPU family carries no limit)",
    ),
)
FABRIC_RULES: Final[tuple[AlertRule, ...]] = tuple(d.rule for d in FABRIC_DEFINITIONS)
