"""The builtin rules of the node's host: its memory nearly all taken, its CPUs contended.

Part of ``alerts.catalogue`` (which lists them after the fabric rules); the same conventions hold. Their checks live
in ``alerts.hostpressure``, their PromQL in ``alerts.promqlhost``; what they read comes from the agent's host reader
(``HostReading``, ``JobHostReading``). Each explains the ``JobInputBound`` of the jobs on its node
(``alerts.causes``). ``docs/alerts-host.md`` explains each.
"""

from __future__ import annotations

from typing import Final

from gpulens.alerts import hostpressure, promqlhost
from gpulens.alerts.base import AlertRule
from gpulens.alerts.definition import Definition, RoundPlan
from gpulens.alerts.names import HOST_CPU_CONTENTION, HOST_MEMORY_PRESSURE

MINUTE: Final = 60.0

HOST_DEFINITIONS: Final[tuple[Definition, ...]] = (
    Definition(
        AlertRule(
            name=HOST_MEMORY_PRESSURE,
            severity="warning",
            for_s=2 * MINUTE,
            scope="node",
            thresholds={"memory_available_ratio_min": 0.05},
            meaning="The node's available memory (MemAvailable over MemTotal) is below `memory_available_ratio_min`: "
            "the kernel reclaims page cache and swaps, the CPUs wait on I/O, and the jobs' data loaders starve (their "
            "JobInputBound is this alert's incident).",
            action="Find what holds the host's memory (the jobs' cgroups, page cache, a leaking process); lower the "
            "memory the jobs pin (pinned buffers, prefetch, dataset caches) or give them a memory limit.",
        ),
        check=hostpressure.host_memory_pressure,
        round=RoundPlan(whole=False, hosts=True),
        export=promqlhost.host_memory_pressure,
    ),
    Definition(
        AlertRule(
            name=HOST_CPU_CONTENTION,
            severity="warning",
            for_s=5 * MINUTE,
            scope="node",
            thresholds={"busy_ratio": 0.95, "cgroup_limit_ratio": 0.95},
            meaning="The node's CPUs are busy (neither idle nor in iowait) at least `busy_ratio` of the time, or a "
            "job's cgroup uses at least `cgroup_limit_ratio` of its CPU limit: processes wait for a CPU, and a data "
            "loader that cannot keep up leaves its GPUs waiting (their JobInputBound is this alert's incident).",
            action="Give the job's data loader more CPU (workers, its cgroup's limit) or move preprocessing to the "
            "GPU; on a saturated node, find what else runs there (top, the jobs' cgroups).",
        ),
        check=hostpressure.host_cpu_contention,
        round=RoundPlan(whole=False, hosts=True),
        export=promqlhost.host_cpu_contention,
    ),
)
