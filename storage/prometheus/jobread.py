"""``PromReader.jobs``: job summaries over a range from raw series, from the recording rules' series where they cover
the range, or from both where the rules began inside it (a Prometheus whose rules were loaded minutes ago).

Split: the rules' first evaluation ``first`` records the sums of the interval before it, so the range is cut at
``first - interval``: the part before it is read raw (``raw``, as a range without rules is), the part after from the
recorded sums (``recorded.job_sums``), at the same time, and the two joined (``jobquery.Summaries.merge``); the GPUs
each job holds per step are counted over the whole range, raw before ``first`` and from the recorded counts from it.
A range the rules cover whole is read recorded only, one before they began raw only, and so is one whose raw part
would be more than half of it (``RAW_SHARE_MAX``: rules loaded minutes ago).
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, Protocol

from gpulens.storage.prometheus import families as fam
from gpulens.storage.prometheus import jobquery, recorded
from gpulens.storage.records import JOB_POINTS, JobSummary

PARALLEL: Final = 4  # as the reader's other calls: queries in flight at once
# The most of the range the raw part of a split may take: past it the raw read costs about what the whole range's
# does, and the recorded read and the join come on top. At 8,000 GPUs with the rules 5 minutes old (the last hour
# read), the split took 1.45 s against 1.19 s for the raw read alone (bench_prometheus --rules-minutes 5, 2026-12-07).
RAW_SHARE_MAX: Final = 0.5


class Reader(recorded.PromReader, Protocol):
    use_recorded: bool

    def _sources(self, field: str) -> list[fam.Source]: ...


def jobs(reader: Reader, start: float, end: float, job_id: str | None = None) -> list[JobSummary]:
    """Every job's summary over [start, end] (or one job's: raw, its GPUs' statistics only)."""
    lo, hi, step = reader._step(start, end, JOB_POINTS + 1)
    if job_id is not None or not reader.use_recorded:
        return raw(reader, lo, hi, step, job_id).result()
    clock, why = recorded.clock_at(reader, "jobs", lo, reader.clock.now())
    if clock is not None and why is None:
        recorded.noted(reader, "jobs", clock, None)
        return recorded.job_sums(reader, lo, hi, step, lo + step).result()
    if clock is None or why != recorded.BEGAN_LATE or clock[0] - clock[2] >= hi:
        recorded.noted(reader, "jobs", None, why)  # no rules running, or none evaluated in the range yet
        return raw(reader, lo, hi, step).result()
    cut = clock[0] - clock[2]
    recorded.noted(reader, "jobs", clock, None)  # read recorded where it pays, so no hint to load the rules
    if cut - lo > RAW_SHARE_MAX * (hi - lo):  # rules that began lately: raw only
        return raw(reader, lo, hi, step).result()
    held_from = lo + math.ceil((clock[0] - lo) / step) * step  # the first step the recorded counts answer
    dcgm = any(reader._exists(n) for n in fam.DCGM_PRESENCE)
    client = reader.client
    with ThreadPoolExecutor(3) as pool:
        before = pool.submit(raw, reader, lo, cut, step, held_until=lo)
        counted = pool.submit(
            client.query_range, jobquery.held_query(None, dcgm=dcgm, overlap=False), lo + step, held_from - step, step
        )
        recounted = pool.submit(client.query_range, recorded.JOB_HELD, held_from, hi, step)
        out = before.result().merge(recorded.job_sums(reader, cut, hi, step, hi + step))
        if out.overlap:  # one GPU's job named by both sources: counted once, at a cost
            held = jobquery.held_query(None, dcgm=True, overlap=True)
            counted = pool.submit(client.query_range, held, lo + step, held_from - step, step)
        out.add_held(counted.result())
        out.add_held(recounted.result())
    return out.result()


def raw(
    reader: Reader,
    lo: float,
    hi: float,
    step: float,
    job_id: str | None = None,
    *,
    held_until: float | None = None,
) -> jobquery.Summaries:
    """Aggregated by job in Prometheus (``storage.prometheus.jobquery``) over (``lo``, ``hi``]: at once the (job,
    GPU) pairs, the GPUs' statistics and the GPUs held per step (to ``held_until``, default ``hi``); once the pairs
    are in, where jobs came or went in the range, the per-step reads of those GPUs. (One job: its pairs first, then
    its GPUs' statistics.)"""
    client = reader.client
    out = jobquery.Summaries(step)
    dcgm = any(reader._exists(n) for n in fam.DCGM_PRESENCE)
    held_end = hi if held_until is None else held_until

    def per_step(gpus: set[str]) -> dict[str, Any]:
        queries = jobquery.unsettled_queries(job_id, sorted(gpus), step, reader._sources, dcgm=out.dcgm)
        return {tag: pool.submit(client.query_range, q, lo + step, hi, step) for tag, q in queries.items()}

    def count(held: str) -> Any:
        return pool.submit(client.query_range, held, lo + step, held_end, step) if held_end >= lo + step else None

    with ThreadPoolExecutor(PARALLEL) as pool:
        counted = count(jobquery.held_query(job_id, dcgm=dcgm, overlap=False))
        pairs = pool.submit(client.query, jobquery.pairs_query(job_id, lo, hi, dcgm=dcgm), hi)
        stats: dict[str, Any] = {}
        if job_id is None:  # every GPU's statistics, while the pairs come
            queries = jobquery.stats_queries(lo, hi, reader._sources)
            stats = {tag: pool.submit(client.query, promql, hi) for tag, promql in queries.items()}
        out.add_pairs(pairs.result())
        if not out.held:
            return out
        if out.overlap:  # one GPU's job named by both sources: counted once, at a cost
            counted = count(jobquery.held_query(job_id, dcgm=True, overlap=True))
        if job_id is not None:  # one job: its GPUs' statistics only
            gpus = sorted({uuid for _, uuid in out.held})
            queries = jobquery.stats_queries(lo, hi, reader._sources, gpus)
            stats = {tag: pool.submit(client.query, promql, hi) for tag, promql in queries.items()}
        unsettled = per_step(out.unsettled) if out.unsettled else {}
        out.add_stats({tag: future.result() for tag, future in stats.items()})
        late = per_step(out.late) if out.late else {}
        for answers in (unsettled, late):
            out.add_unsettled({tag: future.result() for tag, future in answers.items()})
        if counted is not None:
            out.add_held(counted.result())
    return out
