"""Usage reports over Prometheus: GPU-hours allocated and used, idle share, energy, cost and hung jobs per user,
account or partition, and the idle share over time, from the exporters' series.

A mix-in of ``gpulens.storage.prometheus.reader.PromReader`` (its module is full). Each job of the period is read as
the jobs page reads it (``PromReader.jobs``: its GPUs, user and GPU-hours, the steps its GPUs were held), then, in
four instant queries at the period's end whatever the jobs and GPUs, each job's share of its GPUs' samples: at each
step of the period (a subquery at the jobs' step) a GPU held by a job (``gpulens_gpu_job_info``, or dcgm-exporter's
job labels: ``jobquery.pairs``) adds its utilization sample to the job's, and to its idle ones when below
``Prices.idle_utilization`` (the SQL path's rule, ``storage.jobsummary.idle_below``), and its power times the step
to the job's energy; the steps a ``CommunicationStall`` alert (Prometheus's ``ALERTS``, where Prometheus evaluates
the exported rules) names the job are its hung time. Accounts and partitions come from ``gpulens_job_info``
(``PromReader.job_info``). The rows are made by the SQL path's own function (``storage.usagereport.rows``), so both
backends add up and group the jobs the same way.

Energy is the power's integral here (the SQL path prefers the energy counter where the GPU has one); a job seen
only at the period's edges is counted from the samples inside it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Final, Protocol

from gpulens.clock import Clock
from gpulens.model import JobInfo
from gpulens.settings import Prices
from gpulens.storage import usagerows as usagereport
from gpulens.storage.prometheus import families as fam
from gpulens.storage.prometheus import jobquery
from gpulens.storage.prometheus.client import PromClient, PromSeries, quote
from gpulens.storage.records import JOB_POINTS, IdlePoint, JobAccount, JobSummary, UsageRow

ALERTS: Final = "ALERTS"
STALL: Final = "CommunicationStall"


class _Reader(Protocol):
    client: PromClient
    clock: Clock

    def jobs(self, start: float, end: float, *, job_id: str | None = None) -> list[JobSummary]: ...
    def job_info(self, job_ids: Sequence[str]) -> dict[str, JobInfo]: ...
    def _step(self, start: float, end: float, max_points: int) -> tuple[float, float, float]: ...
    def _sources(self, field: str) -> list[fam.Source]: ...
    def _exists(self, name: str) -> bool: ...


def gpu_field(sources: Sequence[fam.Source]) -> str:
    """A field per GPU (label ``uuid``), in SI units, from the source ``PromReader.series`` would read."""
    ranked = sorted(sources, key=lambda s: (0 if s.dcgm else 10) + s.rank, reverse=True)
    parts = []
    for source in ranked:
        expr = source.selector("")
        if source.factor != 1.0:
            expr = f"({expr}) * {source.factor!r}"
        if source.dcgm:
            expr = f'label_replace({expr}, "uuid", "$1", "UUID", "(.+)")'
        parts.append(f"(max by (uuid) ({expr}))")
    return " or on (uuid) ".join(parts)


def per_job_queries(reader: _Reader, window: str, idle: float) -> dict[str, str]:
    """The expressions, per job (label ``job_id``), of each GPU's samples while the job held it, over ``window``
    (a subquery's ``[range:step]``), by name: ``n`` utilization samples, ``idle`` those below ``idle``, ``joules``
    the power's sum (times the step: joules), ``stall`` the steps a stall alert named the job."""
    dcgm = any(reader._exists(n) for n in fam.DCGM_PRESENCE)
    held = f"group by (job_id, uuid) ({jobquery.pairs(None, '', dcgm=dcgm)})"
    out: dict[str, str] = {}
    util, power = reader._sources("utilization_ratio"), reader._sources("power_watts")

    def on_held(expr: str, function: str) -> str:
        return f"sum by (job_id) ({function}(({held} * on (uuid) group_left () ({expr})){window}))"

    if util:
        out["n"] = on_held(gpu_field(util), "count_over_time")
        out["idle"] = on_held(f"({gpu_field(util)}) < {idle!r}", "count_over_time")
    if power:
        out["joules"] = on_held(gpu_field(power), "sum_over_time")
    if reader._exists(ALERTS):
        firing = f'{ALERTS}{{alertname={quote(STALL)}, alertstate="firing", job_id!=""}}'
        out["stall"] = f"count_over_time((max by (job_id) ({firing})){window})"
    return out


def _by_job(series: Sequence[PromSeries]) -> dict[str, float]:
    return {s.labels["job_id"]: s.value for s in series if s.labels.get("job_id") and math.isfinite(s.value)}


def _groups(reader: _Reader, by: str, jobs: Sequence[JobSummary]) -> dict[str, str | None]:
    if by == "user":
        return {j.job_id: j.user for j in jobs}
    info = reader.job_info([j.job_id for j in jobs])
    return {j: (i.account if by == "account" else i.partition) for j, i in info.items()}


def _account(job: JobSummary, got: Mapping[str, float], step: float, prices: Prices, end: float) -> JobAccount:
    n = got.get("n", 0.0)
    kwh = got["joules"] * step / 3.6e6 if "joules" in got else None
    return JobAccount(
        job_id=job.job_id,
        user=job.user,
        start=job.first_seen,
        end=job.last_seen,
        ended=job.last_seen < end - step,
        gpus=len(job.gpus),
        nodes=job.nodes,
        gpu_hours=job.gpu_hours,
        energy_kwh=kwh,
        energy_from=None if kwh is None else "power",
        utilization_mean=job.utilization_ratio_mean,
        memory_peak_bytes=job.memory_used_bytes_max,
        idle_ratio=got.get("idle", 0.0) / n if n else None,
        stall_seconds=got.get("stall", 0.0) * step,
        cost=job.gpu_hours * prices.per_gpu_hour + (kwh or 0.0) * prices.per_kwh,
        currency=prices.currency,
        carbon_gco2e=None if kwh is None else kwh * prices.carbon_gco2e_per_kwh,
    )


class UsageReads:
    """The usage reads of the store interface (``storage.reading.StoreReader``) over Prometheus."""

    def usage(self: _Reader, by: str, start: float, end: float, prices: Prices) -> list[UsageRow]:
        """One row per group, most GPU-hours first (``storage.usagereport.rows``)."""
        if by not in usagereport.GROUPINGS:
            raise ValueError(f"by: expected one of {', '.join(usagereport.GROUPINGS)}")
        jobs = self.jobs(start, end)[: usagereport.MAX_JOBS]
        if not jobs:
            return []
        lo, hi, step = self._step(start, end, JOB_POINTS + 1)
        window = f"[{round(hi - lo)}s:{step:g}s]"
        got: dict[str, dict[str, float]] = defaultdict(dict)
        for tag, promql in per_job_queries(self, window, prices.idle_utilization).items():
            for job_id, value in _by_job(self.client.query(promql, hi)).items():
                got[job_id][tag] = value
        accounts = [_account(j, got.get(j.job_id, {}), step, prices, end) for j in jobs]
        return usagereport.rows(accounts, _groups(self, by, jobs), prices.currency)

    def idle_trend(self: _Reader, by: str, start: float, end: float, step_s: float, prices: Prices) -> list[IdlePoint]:
        """Per bucket of ``step_s`` and per group: the allocated GPUs' samples (one per GPU and subquery step) and
        the idle ones among them, oldest bucket first."""
        if by not in usagereport.GROUPINGS:
            raise ValueError(f"by: expected one of {', '.join(usagereport.GROUPINGS)}")
        jobs = self.jobs(start, end)[: usagereport.MAX_JOBS]
        if not jobs:
            return []
        inner = min(step_s, self._step(start, end, JOB_POINTS + 1)[2])
        queries = per_job_queries(self, f"[{step_s:g}s:{inner:g}s]", prices.idle_utilization)
        if "n" not in queries:
            return []
        groups = _groups(self, by, jobs)
        first = math.floor(start / step_s) * step_s
        counts: dict[tuple[float, str], list[int]] = defaultdict(lambda: [0, 0])
        for i, tag in enumerate(("n", "idle")):
            for s in self.client.query_range(queries[tag], first + step_s, end + step_s, step_s):
                group = groups.get(s.labels.get("job_id", "")) or usagereport.UNKNOWN
                for t, v in s.samples:
                    if math.isfinite(v):
                        counts[(t - step_s, group)][i] += round(v)
        return [
            IdlePoint(at, group, samples, idle)
            for (at, group), (samples, idle) in sorted(counts.items())
            if samples > 0
        ]
