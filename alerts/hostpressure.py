"""The node's host under pressure: ``HostMemoryPressure`` (its memory nearly all taken) and ``HostCpuContention``
(its CPUs saturated, or a job's cgroup held at its CPU limit).

Pure checks like the others (``alerts.checks``), over the host readings of the round (``HostReading``,
``JobHostReading``): one alert per node, labelled ``node`` only. They name the host a job's loader waits on, so that
an incident of ``JobInputBound`` has its cause (``alerts.causes``): the node, with what starves it.
"""

from __future__ import annotations

from gpulens.alerts.base import AlertRule, Candidate, percent, rule_labels
from gpulens.alerts.history import History
from gpulens.fabricmodel import JobHostReading


def host_memory_pressure(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    """A node whose available memory (MemAvailable over MemTotal) is below ``memory_available_ratio_min``."""
    out = []
    floor = rule.threshold("memory_available_ratio_min")
    for host in history.fabric.hosts():
        if host.memory_available_bytes is None or not host.memory_total_bytes:
            continue
        available = host.memory_available_bytes / host.memory_total_bytes
        if available >= floor:
            continue
        iowait = f", iowait {percent(host.cpu_iowait_ratio)}" if host.cpu_iowait_ratio is not None else ""
        summary = f"node {host.node}: {available * 100:.1f}% of its memory available{iowait}"
        description = (
            f"The node has {available * 100:.1f}% of its {host.memory_total_bytes / 2**30:.0f} GiB available "
            f"(below {percent(floor)}): the kernel reclaims page cache and swaps, and the jobs' data loaders wait on "
            "the disk."
        )
        out.append(Candidate(rule.name, rule_labels(rule, {"node": host.node}), available, summary, description))
    return out


def _at_limit(rule: AlertRule, share: JobHostReading) -> bool:
    used, limit = share.cpu_used_cores, share.cpu_limit_cores
    return used is not None and bool(limit) and used >= rule.threshold("cgroup_limit_ratio") * (limit or 0.0)


def host_cpu_contention(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    """A node whose CPUs are busy at least ``busy_ratio`` of the time, or on which a job's cgroup uses at least
    ``cgroup_limit_ratio`` of its CPU limit (its processes wait for the CPU bandwidth controller)."""
    limited: dict[str, list[JobHostReading]] = {}
    for share in history.fabric.all_job_hosts():
        if _at_limit(rule, share):
            limited.setdefault(share.node, []).append(share)
    busy_floor = rule.threshold("busy_ratio")
    out = []
    for host in history.fabric.hosts():
        busy = host.cpu_busy_ratio
        saturated = busy is not None and busy >= busy_floor
        jobs = sorted(limited.get(host.node, ()), key=lambda s: s.job_id)
        if not saturated and not jobs:
            continue
        parts = [f"CPUs {percent(busy)} busy"] if saturated and busy is not None else []
        parts += [f"job {s.job_id}'s cgroup at {s.cpu_used_cores:.1f} of its {s.cpu_limit_cores:g} cores" for s in jobs]
        summary = f"node {host.node}: " + "; ".join(parts)
        description = (
            f"The node's CPUs are contended ({'; '.join(parts)}): processes wait for a CPU, and a job's data loader "
            "that cannot keep up leaves its GPUs waiting for input."
        )
        value = busy if saturated else max((s.cpu_used_cores or 0.0) / (s.cpu_limit_cores or 1.0) for s in jobs)
        out.append(Candidate(rule.name, rule_labels(rule, {"node": host.node}), value, summary, description))
    return out
