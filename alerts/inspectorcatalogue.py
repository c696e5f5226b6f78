"""The builtin rule over NCCL's Inspector: JobCommunicationSlow (a job's collectives below its own best bandwidth).

Part of ``alerts.catalogue`` (which lists it after the hardware rules); the same conventions hold. Its check lives in
``alerts.inspectorchecks``, its PromQL here (``alerts.promql`` is full); what it reads comes from the agent's reader
of the Inspector's files (docs/nccl-inspector.md).
"""

from __future__ import annotations

from typing import Final

from gpulens.alerts import inspectorchecks
from gpulens.alerts.base import AlertRule
from gpulens.alerts.definition import Definition, Exported, RoundPlan
from gpulens.alerts.names import JOB_COMMUNICATION_SLOW

MINUTE: Final = 60.0
_KEY: Final = "job_id, comm, collective, size"
_BUS: Final = 'gpulens_nccl_bus_bandwidth_bytes_per_second{job_id!=""}'


def job_communication_slow_promql(rule: AlertRule) -> list[Exported]:
    """The fastest node's bandwidth now below ``bandwidth_ratio`` of the job's best over 30 minutes, where the key
    was measured ``baseline_s`` ago already."""
    t = rule.threshold
    now = f"max by ({_KEY}) ({_BUS})"
    best = f"max by ({_KEY}) (max_over_time({_BUS}[30m]))"
    back = t("baseline_s")
    seen = f"max by ({_KEY}) (max_over_time({_BUS}[{1800 - back:g}s] offset {back:g}s))"
    expr = f"{now} < {t('bandwidth_ratio'):g} * {best} and on({_KEY}) {seen}"
    summary = (
        "JobCommunicationSlow: job {{ $labels.job_id }}: {{ $labels.collective }} of {{ $labels.size }} on "
        "communicator {{ $labels.comm }} below its usual bus bandwidth."
    )
    return [Exported(expr, rule.for_s, summary)]


INSPECTOR_DEFINITIONS: Final[tuple[Definition, ...]] = (
    Definition(
        AlertRule(
            name=JOB_COMMUNICATION_SLOW,
            severity="warning",
            for_s=5 * MINUTE,
            scope="job",
            thresholds={"bandwidth_ratio": 0.75, "baseline_s": 300.0},
            meaning="NCCL's Inspector measures one of a job's collectives (the same communicator, collective and "
            "message-size class) at less than 75 % of the bus bandwidth the job itself reached in the last 30 "
            "minutes: its links carry less than they did (a congested fabric, a port at half its rate, a rank the "
            "others wait for). Labelled with the communicator (`comm`), `collective` and `size`; the description "
            "names the node whose ranks measured least, where the nodes differ. Needs the Inspector in the job "
            "and `--nccl-inspector-dir` on the agents.",
            action="Look at the named node's ports (IbLinkDegraded, FabricCongestion, IbErrors) and GPUs "
            "(JobStraggler) first; if nothing stands out, compare the job's placement with its earlier runs.",
        ),
        check=inspectorchecks.job_communication_slow,
        round=RoundPlan(whole=False, inspector=True),
        export=job_communication_slow_promql,
    ),
)
