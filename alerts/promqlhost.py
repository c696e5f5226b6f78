"""The PromQL of the node's host rules (``alerts.hostcatalogue``): memory pressure and CPU contention.

Split from ``alerts.promql`` (whose conventions it follows) so each stays one readable module; each function takes
the rule and returns what ``gpulens rules export`` writes for it. One series per node (``by (node)``), as the engine
raises one alert per node.
"""

from __future__ import annotations

from typing import Final

from gpulens.alerts.base import AlertRule
from gpulens.alerts.definition import Exported

# A job's CPU use in cores: the rate of its cgroup's CPU time (the exporter's ``cpu_used_cores`` is the same rate).
JOB_CORES: Final = "rate(gpulens_job_cpu_seconds_total[1m])"


def host_memory_pressure(rule: AlertRule) -> list[Exported]:
    floor = rule.threshold("memory_available_ratio_min")
    expr = f"max by (node) (gpulens_host_memory_available_bytes / gpulens_host_memory_total_bytes) < {floor:g}"
    summary = f"{rule.name}: {{{{ $labels.node }}}} has {{{{ $value | humanizePercentage }}}} of its memory available."
    return [Exported(expr, rule.for_s, summary)]


def host_cpu_contention(rule: AlertRule) -> list[Exported]:
    """The node's CPUs saturated, or else the share of its CPU limit the most limited job's cgroup uses."""
    busy = rule.threshold("busy_ratio")
    limit = rule.threshold("cgroup_limit_ratio")
    cgroups = f"max by (node) ({JOB_CORES} / (gpulens_job_cpu_limit_cores > 0))"
    expr = f"(max by (node) (gpulens_host_cpu_busy_ratio) >= {busy:g}) or ({cgroups} >= {limit:g})"
    summary = (
        f"{rule.name}: the CPUs of {{{{ $labels.node }}}} are contended ({{{{ $value | humanizePercentage }}}} busy, "
        "or of a job's cgroup CPU limit)."
    )
    return [Exported(expr, rule.for_s, summary)]
