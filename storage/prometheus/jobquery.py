"""Job summaries over a time range in one PromQL query, aggregated by job inside Prometheus.

The query's answer grows with the jobs and the GPUs they held, never with the samples: per job, its GPU-steps
held, first and last step, the count, sum and sum of squares of its GPUs' per-step mean utilization, and the count,
sum and maximum of their per-step mean and peak memory (each a ``sum/min/max_over_time`` of a subquery at the
range's step, ``gl`` naming which); and per (job, GPU) held, one series naming the GPU's node and the job's user.

Membership is gpulens's ``gpulens_gpu_job_info`` or, for dcgm-exporter series, its ``pod``/``namespace`` labels
(``<namespace>/<pod>``) and ``hpc_job`` label, each turned into ``job_id``, ``uuid`` and ``node`` labels with
``label_replace``/``label_join`` so that both sources join the same way (the rules of ``families.job_of`` and
``families.dcgm_node``). A GPU's value of a field comes from its gpulens family, else from the highest-ranked
dcgm-exporter name that holds it (``or on (uuid)``), converted by the field table's factor: the choice ``series``
makes. The summaries are those ``PromReader.series`` gives when read per GPU and summed per job (JOB_POINTS steps,
each step's mean of each GPU held at that step).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Final

from storage.jobstats import JobSummary
from storage.prometheus import families as fam
from storage.prometheus.client import PromSeries, quote

_LABELS: Final = "job_id, uuid, node, user"
_DCGM_BY: Final = "UUID, Hostname, hostname, instance"
_NOT_EMPTY: Final = '{}!=""'


def _relabel(expr: str, target: str, source: str, regex: str) -> str:
    return f"label_replace({expr}, {quote(target)}, {quote('$1')}, {quote(source)}, {quote(regex)})"


def _dcgm_identity(expr: str) -> str:
    """``uuid`` from ``UUID`` and ``node`` from ``hostname``, else ``Hostname``, else the ``instance`` host."""
    expr = _relabel(expr, "uuid", "UUID", "(.+)")
    expr = _relabel(expr, "node", "instance", "(.*)")
    expr = _relabel(expr, "node", "instance", "(.*):[^:\\]]*")
    expr = _relabel(expr, "node", "Hostname", "(.+)")
    return _relabel(expr, "node", "hostname", "(.+)")


def membership(job_id: str | None) -> str:
    """One series (value 1) per job and GPU held at the evaluation time, labelled ``job_id, uuid, node, user``."""
    own = "" if job_id is None else f"job_id={quote(job_id)}"
    gl = f"max by ({_LABELS}) ({fam.JOB_INFO}{{{own}}})"
    pods = f"group by ({_DCGM_BY}, pod, namespace) ({fam.selector(fam.DCGM_PRESENCE, _NOT_EMPTY.format('pod'))})"
    pod_jobs = _relabel(f'label_join({pods}, "job_id", "/", "namespace", "pod")', "job_id", "job_id", "/(.*)")
    hpc = f"group by ({_DCGM_BY}, hpc_job) ({fam.selector(fam.DCGM_PRESENCE, _NOT_EMPTY.format('hpc_job'))})"
    hpc_jobs = _relabel(hpc, "job_id", "hpc_job", "(.+)")
    dcgm = f"max by ({_LABELS}) ({_dcgm_identity(f'{pod_jobs} or {hpc_jobs}')})"
    if job_id is not None:
        dcgm = f'{dcgm} and on (job_id) label_replace(vector(1), "job_id", {quote(job_id)}, "", "")'
    return f"max by ({_LABELS}) ({gl} or {dcgm})"


def per_gpu(field: str, function: str, window: str) -> str:
    """One series per GPU (label ``uuid``): ``function`` (``avg_over_time``...) of ``field`` over ``window``, from
    the source ``PromReader.series`` would read, in gpulens units."""
    ranked = sorted(fam.sources(field), key=lambda s: (0 if s.dcgm else 10) + s.rank, reverse=True)
    parts = []
    for source in ranked:
        expr = f"{function}({source.selector('')}[{window}])"
        if source.factor != 1.0:
            expr = f"{expr} * {source.factor!r}"
        if source.dcgm:
            expr = _relabel(expr, "uuid", "UUID", "(.+)")
        parts.append(f"max by (uuid) ({expr})")
    return " or on (uuid) ".join(f"({p})" for p in parts)


def _tag(expr: str, tag: str) -> str:
    return f'label_replace({expr}, "gl", {quote(tag)}, "", "")'


def summary_query(job_id: str | None, lo: float, hi: float, step: float) -> str:
    """The instant query, evaluated at ``hi``, over the steps ``lo + step`` ... ``hi`` (bucket ``t - step`` to
    ``t`` each)."""
    held = membership(job_id)
    window = f"{step:g}s"
    sub = f"[{round((hi - lo - step / 2) * 1000)}ms:{window}]"
    util = per_gpu("utilization_ratio", "avg_over_time", window)
    memory = per_gpu("memory_used_bytes", "avg_over_time", window)
    peak = per_gpu("memory_used_bytes", "max_over_time", window)

    def joined(value: str) -> str:
        return f"(({value}) * on (uuid) group_right {held})"

    parts = {
        "member": f"max_over_time(({held}){sub})",
        "held": f"sum_over_time((count by (job_id) ({held})){sub})",
        "first": f"min_over_time((count by (job_id) ({held}) * 0 + time()){sub})",
        "last": f"max_over_time((count by (job_id) ({held}) * 0 + time()){sub})",
        "util_n": f"sum_over_time((count by (job_id) {joined(util)}){sub})",
        "util_sum": f"sum_over_time((sum by (job_id) {joined(util)}){sub})",
        "util_sq": f"sum_over_time((sum by (job_id) ({joined(util)} ^ 2)){sub})",
        "mem_n": f"sum_over_time((count by (job_id) {joined(memory)}){sub})",
        "mem_sum": f"sum_over_time((sum by (job_id) {joined(memory)}){sub})",
        "mem_max": f"max_over_time((max by (job_id) {joined(peak)}){sub})",
    }
    return " or ".join(_tag(expr, tag) for tag, expr in parts.items())


def summaries(result: Sequence[PromSeries], step: float) -> list[JobSummary]:
    """The job summaries from ``summary_query``'s answer, most GPU-hours first."""
    gpus: dict[str, set[str]] = defaultdict(set)
    nodes: dict[str, set[str]] = defaultdict(set)
    users: dict[str, str] = {}
    stats: dict[str, dict[str, float]] = defaultdict(dict)
    for s in result:
        job, tag = s.labels.get("job_id"), s.labels.get("gl", "")
        if not job:
            continue
        if tag == "member":
            if s.labels.get("uuid"):
                gpus[job].add(s.labels["uuid"])
            if s.labels.get("node"):
                nodes[job].add(s.labels["node"])
            if s.labels.get("user"):
                users[job] = s.labels["user"]
        elif math.isfinite(s.value):
            stats[job][tag] = s.value
    out = []
    for job, members in gpus.items():
        got = stats.get(job, {})
        held = got.get("held", 0.0)
        if not held:
            continue
        util_n, mem_n = got.get("util_n", 0.0), got.get("mem_n", 0.0)
        mean = got.get("util_sum", 0.0) / util_n if util_n else None
        stddev = math.sqrt(max(0.0, got.get("util_sq", 0.0) / util_n - mean * mean)) if mean is not None else None
        out.append(
            JobSummary(
                job_id=job,
                user=users.get(job),
                gpus=tuple(sorted(members)),
                nodes=tuple(sorted(nodes.get(job, ()))),
                first_seen=got.get("first", step) - step,
                last_seen=got.get("last", 0.0),
                gpu_hours=held * step / 3600.0,
                utilization_ratio_mean=mean,
                utilization_ratio_stddev=stddev,
                memory_used_bytes_mean=got.get("mem_sum", 0.0) / mem_n if mem_n else None,
                memory_used_bytes_max=round(got["mem_max"]) if "mem_max" in got else None,
                resolution="prometheus",
            )
        )
    return sorted(out, key=lambda j: (-j.gpu_hours, j.job_id))
