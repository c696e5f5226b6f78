"""Job summaries over a time range, aggregated by job inside Prometheus: a query count that does not grow with the
GPUs or the jobs, and answers that grow with the jobs and with the GPUs that changed jobs, never with the samples.

1. Instant queries over the whole range, with range functions on raw series (one pass, no per-step evaluation):
   every (job, GPU) pair held in the range (``count_over_time`` of the membership series, labelled
   ``job_id, uuid, node, user``: the page's GPUs, nodes and user); then, at once, per GPU the count, mean and
   standard deviation of its utilization samples and the mean and peak of its memory. A pair is *settled* when the
   job held the GPU at every utilization sample of the range: the job takes the GPU's statistics whole.
2. At the same time, one range query at the range's step (``held_query``): the GPUs each job held at each step,
   counted by job in PromQL (its GPU-steps, hence GPU-hours, and first and last step), as the SQL path counts
   allocations.
3. Only when pairs were unsettled (a job came or went in the range: a GPU held by several jobs, or for fewer
   samples than others), at the same time as the statistics, range queries (``unsettled_queries``) of those GPUs'
   membership and per-step mean utilization and mean and peak memory, summed per job here: exact, and as costly as
   the turnover is large.

Membership is gpulens's ``gpulens_gpu_job_info`` or, for dcgm-exporter series, its ``pod``/``namespace`` labels
(``<namespace>/<pod>``) and ``hpc_job`` label, turned into ``job_id``, ``uuid`` and ``node`` labels with
``label_replace``/``label_join`` (the rules of ``families.job_of`` and ``families.dcgm_node``). A GPU's value of a
field comes from its gpulens family, else from the highest-ranked dcgm-exporter name that holds it
(``or on (uuid)``), converted by the field table's factor: the choice ``PromReader.series`` makes.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from gpulens.model import JobInfo
from gpulens.storage.prometheus import families as fam
from gpulens.storage.prometheus.client import PromSeries, quote, regex_of
from gpulens.storage.records import JobSummary

_LABELS: Final = "job_id, uuid, node, user"
_DCGM_BY: Final = "UUID, Hostname, hostname, instance"
_NOT_EMPTY: Final = '{}!=""'
Sources = Callable[[str], Sequence[fam.Source]]
# per GPU over the range: (tag, field, range function of {s}, the range selector)
_GPU_STATS: Final = (
    ("n", "utilization_ratio", "count_over_time({s})"),
    ("u", "utilization_ratio", "avg_over_time({s})"),
    ("s", "utilization_ratio", "stddev_over_time({s})"),
    ("m", "memory_used_bytes", "avg_over_time({s})"),
    ("mx", "memory_used_bytes", "max_over_time({s})"),
)


def _relabel(expr: str, target: str, source: str, regex: str) -> str:
    return f"label_replace({expr}, {quote(target)}, {quote('$1')}, {quote(source)}, {quote(regex)})"


def _tag(expr: str, tag: str) -> str:
    return f'label_replace({expr}, "gl", {quote(tag)}, "", "")'


def dcgm_identity(expr: str) -> str:
    """``uuid`` from ``UUID`` and ``node`` from ``hostname``, else ``Hostname``, else the ``instance`` host."""
    expr = _relabel(expr, "uuid", "UUID", "(.+)")
    expr = _relabel(expr, "node", "instance", "(.*)")
    expr = _relabel(expr, "node", "instance", "(.*):[^:\\]]*")
    expr = _relabel(expr, "node", "Hostname", "(.+)")
    return _relabel(expr, "node", "hostname", "(.+)")


def pairs(job_id: str | None, window: str, *, dcgm: bool, uuids: Sequence[str] | None = None) -> str:
    """Per (job, GPU) held: ``count_over_time`` of its membership samples over ``window`` (``[1h]``), labelled
    ``job_id, uuid, node, user`` (dcgm-exporter's tagged ``gl_source="dcgm"``); with ``window`` ``""``, the pairs
    held at the evaluation time, each once. ``dcgm``: read dcgm-exporter's job labels too."""
    own = [f"job_id={quote(job_id)}"] if job_id is not None else []
    own += [f"uuid=~{regex_of(uuids)}"] if uuids is not None else []
    selected = f"{fam.JOB_INFO}{{{', '.join(own)}}}"
    gl = f"sum by ({_LABELS}) (count_over_time({selected}{window}))" if window else selected
    if not dcgm:
        return gl
    matchers = [f"UUID=~{regex_of(uuids)}"] if uuids is not None else []

    def held(label: str) -> str:
        chosen = ", ".join([_NOT_EMPTY.format(label), *matchers])
        if not window:
            return fam.selector(fam.DCGM_PRESENCE, chosen)
        # one name at a time: a range function drops the name, and a GPU exporting two of them would collide
        return " or ".join(f"count_over_time({name}{{{chosen}}}{window})" for name in fam.DCGM_PRESENCE)

    pods = f"sum by ({_DCGM_BY}, pod, namespace) ({held('pod')})"
    pod_jobs = _relabel(f'label_join({pods}, "job_id", "/", "namespace", "pod")', "job_id", "job_id", "/(.*)")
    hpc_jobs = _relabel(f"sum by ({_DCGM_BY}, hpc_job) ({held('hpc_job')})", "job_id", "hpc_job", "(.+)")
    dcgm_pairs = f"sum by ({_LABELS}) ({dcgm_identity(f'{pod_jobs} or {hpc_jobs}')})"
    if job_id is not None:
        dcgm_pairs = f'{dcgm_pairs} and on (job_id) label_replace(vector(1), "job_id", {quote(job_id)}, "", "")'
    if window:
        return f'{gl} or label_replace({dcgm_pairs}, "gl_source", "dcgm", "", "")'
    return f"max by ({_LABELS}) ({gl} or {dcgm_pairs})"


def per_gpu(
    sources: Sequence[fam.Source], template: str, window: str, *, power: int = 1, matchers: Sequence[str] = ()
) -> str:
    """One series per GPU (label ``uuid``): ``template`` (``{s}``: the range selector over ``window``) of the
    field the ``sources`` hold, from the one ``PromReader.series`` would read, times its unit factor to ``power``."""
    ranked = sorted(sources, key=lambda s: (0 if s.dcgm else 10) + s.rank, reverse=True)
    parts = []
    for source in ranked:
        chosen = [m for m in matchers if m.startswith("UUID") == source.dcgm]
        expr = template.format(s=f"{source.selector(', '.join(chosen))}[{window}]")
        if source.factor != 1.0 and power:
            expr = f"({expr}) * {source.factor**power!r}"
        if source.dcgm:
            expr = _relabel(expr, "uuid", "UUID", "(.+)")
        parts.append(f"max by (uuid) ({expr})")
    return " or on (uuid) ".join(f"({p})" for p in parts)


def pairs_query(job_id: str | None, lo: float, hi: float, *, dcgm: bool) -> str:
    """The instant query at ``hi``: every pair held over (``lo``, ``hi``]."""
    return pairs(job_id, f"[{round(hi - lo)}s]", dcgm=dcgm)


def stats_queries(lo: float, hi: float, sources: Sources, uuids: Sequence[str] | None = None) -> dict[str, str]:
    """Instant queries at ``hi``, by name: each GPU's (or each of ``uuids``') statistics over (``lo``, ``hi``]
    (label ``uuid``). ``sources``: the series holding a field (those the store has)."""
    window = f"{round(hi - lo)}s"
    matchers = () if uuids is None else (f"uuid=~{regex_of(uuids)}", f"UUID=~{regex_of(uuids)}")
    return {
        tag: per_gpu(sources(field_), template, window, power=int(tag != "n"), matchers=matchers)
        for tag, field_, template in _GPU_STATS
        if sources(field_)
    }


def held_query(job_id: str | None, *, dcgm: bool, overlap: bool) -> str:
    """For a range query: the GPUs each job holds at each step, counted by job. Each source is counted apart
    (cheap) unless ``overlap`` (one GPU's job named by both sources: counted once)."""
    if overlap:
        return f"count by (job_id) ({pairs(job_id, '', dcgm=True)})"
    own = f"job_id={quote(job_id)}" if job_id is not None else ""
    gl = f"count by (job_id) ({fam.JOB_INFO}{{{own}}})"
    if not dcgm:
        return gl
    dcgm_only = f"count by (job_id) ({pairs(job_id, '', dcgm=True)} unless on (uuid) {fam.JOB_INFO})"
    return f'sum by (job_id) ({gl} or label_replace({dcgm_only}, "gl_source", "dcgm", "", ""))'


def unsettled_queries(
    job_id: str | None, uuids: Sequence[str], step: float, sources: Sources, *, dcgm: bool
) -> dict[str, str]:
    """Range queries, by name: the membership (``member``), mean utilization (``u``) and mean and peak memory
    (``m``, ``mx``) of the GPUs ``uuids`` at each step."""
    window = f"{step:g}s"
    matchers = (f"uuid=~{regex_of(uuids)}", f"UUID=~{regex_of(uuids)}")
    out = {"member": f"group by ({_LABELS}) ({pairs(job_id, '', dcgm=dcgm, uuids=uuids)})"}
    util, memory = sources("utilization_ratio"), sources("memory_used_bytes")
    if util:
        out["u"] = per_gpu(util, "avg_over_time({s})", window, matchers=matchers)
    if memory:
        out["m"] = per_gpu(memory, "avg_over_time({s})", window, matchers=matchers)
        out["mx"] = per_gpu(memory, "max_over_time({s})", window, matchers=matchers)
    return out


@dataclass
class _Job:
    gpus: set[str] = field(default_factory=set)
    nodes: set[str] = field(default_factory=set)
    user: str | None = None
    stats: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    held: int = 0
    first: float | None = None
    last: float | None = None


class Summaries:
    """The answers (``add_pairs`` first, then the others in any order) made into job summaries."""

    def __init__(self, step: float) -> None:
        self.step = step
        self.jobs: dict[str, _Job] = defaultdict(_Job)
        self.held: dict[tuple[str, str], float] = {}  # (job, GPU) -> samples held in the range
        self.unsettled: set[str] = set()  # GPUs read per step
        self.unsettled_pairs: set[tuple[str, str]] = set()
        self.late: set[str] = set()  # GPUs found unsettled only by their statistics
        self.dcgm = False  # some pair comes from dcgm-exporter's labels
        self.overlap = False  # some pair comes from both sources

    def add_pairs(self, result: Sequence[PromSeries]) -> None:
        """The pairs. Unsettled at once, before the statistics come: the GPUs held by more than one job in the range
        and the pairs held for fewer samples than the longest held (the others are checked in ``add_stats``)."""
        for s in result:
            uuid, job = s.labels.get("uuid"), s.labels.get("job_id")
            if not uuid or not job or not math.isfinite(s.value):
                continue
            dcgm = s.labels.get("gl_source") == "dcgm"
            self.dcgm = self.dcgm or dcgm
            if (job, uuid) in self.held:
                self.overlap = True
                if dcgm:
                    continue
            self.held[(job, uuid)] = s.value
            entry = self.jobs[job]
            entry.gpus.add(uuid)
            if s.labels.get("node"):
                entry.nodes.add(s.labels["node"])
            if s.labels.get("user"):
                entry.user = s.labels["user"]
        longest = max(self.held.values(), default=0.0)
        jobs_of: dict[str, int] = defaultdict(int)
        for _, uuid in self.held:
            jobs_of[uuid] += 1
        for (_job, uuid), count in self.held.items():
            if jobs_of[uuid] > 1 or count < longest:
                self.unsettled.add(uuid)
        self.unsettled_pairs = {(job, uuid) for job, uuid in self.held if uuid in self.unsettled}

    def add_stats(self, results: Mapping[str, Sequence[PromSeries]]) -> None:
        """Per-GPU statistics: each settled pair (held at every utilization sample of its GPU) takes its GPU's
        whole; a pair held for fewer goes to ``late`` (read per step after all)."""
        gpus: dict[str, dict[str, float]] = defaultdict(dict)
        for tag, result in results.items():
            for s in result:
                if s.labels.get("uuid") and math.isfinite(s.value):
                    gpus[s.labels["uuid"]][tag] = s.value
        for (job, uuid), count in self.held.items():
            if uuid in self.unsettled:
                continue
            stats = gpus.get(uuid, {})
            n = stats.get("n", 0.0)
            if count < n:
                self.late.add(uuid)
                self.unsettled_pairs.add((job, uuid))
                continue
            got = self.jobs[job].stats
            if n and "u" in stats:
                mean, spread = stats["u"], stats.get("s", 0.0)
                got["util_n"] += n
                got["util_sum"] += mean * n
                got["util_sq"] += (spread * spread + mean * mean) * n
            if n and "m" in stats:
                got["mem_n"] += n
                got["mem_sum"] += stats["m"] * n
            if "mx" in stats:
                got["mem_max"] = max(got.get("mem_max", stats["mx"]), stats["mx"])

    def add_held(self, result: Sequence[PromSeries]) -> None:
        for s in result:
            entry = self.jobs.get(s.labels.get("job_id", ""))
            if entry is None:
                continue
            times = [t for t, v in s.samples if v > 0]
            entry.held += sum(round(v) for _, v in s.samples)
            if times:
                entry.first = min(times) if entry.first is None else min(entry.first, min(times))
                entry.last = max(times) if entry.last is None else max(entry.last, max(times))

    def add_unsettled(self, results: Mapping[str, Sequence[PromSeries]]) -> None:
        """Per step, each unsettled GPU's values added to each job holding it at that step (its unsettled pairs)."""
        values: dict[tuple[str, str], dict[float, float]] = {}
        for tag, result in results.items():
            for s in result:
                if tag != "member" and s.labels.get("uuid"):
                    values[(tag, s.labels["uuid"])] = {t: v for t, v in s.samples if math.isfinite(v)}
        for s in results.get("member", ()):
            job, uuid = s.labels.get("job_id", ""), s.labels.get("uuid", "")
            entry = self.jobs.get(job)
            if entry is None or (job, uuid) not in self.unsettled_pairs:
                continue
            for t, _ in s.samples:
                util = values.get(("u", uuid), {}).get(t)
                if util is not None:
                    entry.stats["util_n"] += 1
                    entry.stats["util_sum"] += util
                    entry.stats["util_sq"] += util * util
                memory = values.get(("m", uuid), {}).get(t)
                if memory is not None:
                    entry.stats["mem_n"] += 1
                    entry.stats["mem_sum"] += memory
                peak = values.get(("mx", uuid), {}).get(t)
                if peak is not None:
                    entry.stats["mem_max"] = max(entry.stats.get("mem_max", peak), peak)

    def merge(self, other: Summaries) -> Summaries:
        """This range's summaries joined with those of the range next to it (``other``, read at the same step): the
        GPUs, nodes, sums and GPU-steps added, the peaks and first and last steps over both."""
        for job, theirs in other.jobs.items():
            mine = self.jobs[job]
            mine.gpus |= theirs.gpus
            mine.nodes |= theirs.nodes
            mine.user = mine.user or theirs.user
            for tag, value in theirs.stats.items():
                peak = tag == "mem_max"
                mine.stats[tag] = max(mine.stats.get(tag, value), value) if peak else mine.stats[tag] + value
            mine.held += theirs.held
            ends = [t for t in (mine.first, theirs.first) if t is not None]
            mine.first = min(ends) if ends else None
            ends = [t for t in (mine.last, theirs.last) if t is not None]
            mine.last = max(ends) if ends else None
        return self

    def result(self) -> list[JobSummary]:
        out = []
        for job, entry in self.jobs.items():
            if not entry.held or not entry.gpus or entry.first is None or entry.last is None:
                continue
            got = entry.stats
            util_n, mem_n = got.get("util_n", 0.0), got.get("mem_n", 0.0)
            mean = got.get("util_sum", 0.0) / util_n if util_n else None
            variance = got.get("util_sq", 0.0) / util_n - mean * mean if mean is not None else None
            out.append(
                JobSummary(
                    job_id=job,
                    user=entry.user,
                    gpus=tuple(sorted(entry.gpus)),
                    nodes=tuple(sorted(entry.nodes)),
                    first_seen=entry.first - self.step,
                    last_seen=entry.last,
                    gpu_hours=entry.held * self.step / 3600.0,
                    utilization_ratio_mean=mean,
                    utilization_ratio_stddev=None if variance is None else math.sqrt(max(0.0, variance)),
                    memory_used_bytes_mean=got.get("mem_sum", 0.0) / mem_n if mem_n else None,
                    memory_used_bytes_max=round(got["mem_max"]) if "mem_max" in got else None,
                    resolution="prometheus",
                )
            )
        return sorted(out, key=lambda j: (-j.gpu_hours, j.job_id))


def scheduler_info_query(job_ids: Sequence[str], lookback_s: float) -> str:
    """The newest ``gpulens_job_info`` of each job within ``lookback_s``: what the scheduler says of it."""
    return f"last_over_time({fam.SCHEDULER_INFO}{{job_id=~{regex_of(job_ids)}}}[{lookback_s:g}s])"


def scheduler_info(answer: Sequence[PromSeries]) -> dict[str, JobInfo]:
    """Job id -> what the scheduler says of it (name, user, account, partition: what the family exports)."""
    out: dict[str, JobInfo] = {}
    for s in sorted(answer, key=lambda s: sorted(s.labels.items())):
        job_id, labels = s.labels.get("job_id"), s.labels
        if job_id and job_id not in out:
            out[job_id] = JobInfo(
                node=labels.get("node", ""),
                job_id=job_id,
                name=labels.get("name") or None,
                user=labels.get("user") or None,
                account=labels.get("account") or None,
                partition=labels.get("partition") or None,
            )
    return out
