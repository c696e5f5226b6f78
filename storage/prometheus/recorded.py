"""The reads of ``PromReader`` from recorded series (``storage.prometheus.recording``), where they are there.

A page's summary of the whole cluster is read from the few series the recording rules keep when the rules run
(their clock, ``recording.CLOCK``, was evaluated within ``STALE_INTERVALS`` intervals) and cover the range read
(evaluated since its start); otherwise ``None`` comes back, the reader reads the raw series as before, and
``Usage.hint`` says once which rule file would make it faster. ``status`` is what ``gpulens rules doctor`` prints.

* jobs: the (job, GPU) pairs from the membership series (the GPU and node lists), the GPUs held per step from
  ``job:gpulens_gpus:count``, and each job's utilization and memory statistics summed over the range from its
  per-interval sums: 9 queries whose answers are one series per job (or pair), whatever the samples.
* the interconnect page's chart: every GPU's link loads as of the rules' last evaluation (one series per GPU and
  link).
* port problems: every port's flags now (one series per port) and the ports whose errors rose in the range.
* the overview's headline: every node's GPUs up, busy, idle and allocated-but-idle, utilization, memory and power
  summed as of the rules' last evaluation (one query, a series per node and name), so that the page reads of every
  GPU only the fields its heatmap shows.
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Final, Protocol

from gpulens.clock import Clock
from gpulens.fabricmodel import nic_id
from gpulens.ratios import LinkLoad
from gpulens.storage.portproblems import ERROR_POINTS, PORT_PROBLEMS
from gpulens.storage.prometheus import families as fam
from gpulens.storage.prometheus import jobquery, problems
from gpulens.storage.prometheus import recording as rec
from gpulens.storage.prometheus.client import LOOKBACK_S, PromClient, PromQueryError, PromSeries
from gpulens.storage.prometheus.fabric import _nic_key
from gpulens.storage.records import LinkSummary, NodeTotals

STALE_INTERVALS: Final = 3  # recorded series whose newest evaluation is older than this many intervals are stale


@dataclass
class Usage:
    """Which pages a reader read raw for want of recorded series, and whether that was said."""

    missing: dict[str, str] = field(default_factory=dict)  # page -> why
    said: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def hint(self) -> str | None:
        """Once: one line naming the rule file that would make the pages read raw faster; then None."""
        with self.lock:
            if self.said or not self.missing:
                return None
            self.said = True
            pages = " and ".join(sorted(self.missing))
            why = "; ".join(sorted(set(self.missing.values())))
        return (
            f"The {pages} page{'s' if len(self.missing) > 1 else ''} read raw series ({why}): load "
            f"deploy/prometheus/rules/{rec.RULE_FILE} (gpulens rules export --format prometheus-recording) into "
            "Prometheus to make them faster."
        )


class PromReader(Protocol):
    """What these reads use of ``gpulens.storage.prometheus.reader.PromReader`` (which calls them)."""

    client: PromClient
    clock: Clock
    recording: Usage
    min_step_s: float

    def _present(self) -> frozenset[str] | None: ...

    def _exists(self, name: str) -> bool: ...

    def _step(self, start: float, end: float, max_points: int) -> tuple[float, float, float]: ...


def _clock(client: PromClient, lo: float, hi: float) -> tuple[float, float, float] | None:
    """(first, last evaluation in (lo, hi], interval) of the recording rules, or None when none is there (looked for
    over ``STALE_INTERVALS`` default intervals at least: a page of the cluster now has ``lo == hi``)."""
    window = f"[{max(1, round(hi - lo), STALE_INTERVALS * rec.INTERVAL_S)}s]"
    query = (
        f'label_replace(min_over_time({rec.CLOCK}{window}), "gl", "first", "", "") or '
        f'label_replace(max_over_time({rec.CLOCK}{window}), "gl", "last", "", "")'
    )
    got = {s.labels.get("gl"): s for s in client.query(query, hi)}
    if "first" not in got or "last" not in got:
        return None
    interval = got["last"].labels.get("interval", f"{rec.INTERVAL_S}s").removesuffix("s")
    return got["first"].value, got["last"].value, float(interval) if interval.isdigit() else float(rec.INTERVAL_S)


BEGAN_LATE: Final = "the recording rules began after the range's start"


RulesClock = tuple[float, float, float]  # the rules' first and last evaluation, their interval


def clock_at(reader: PromReader, page: str, lo: float, now: float) -> tuple[RulesClock | None, str | None]:
    """The rules' (first, last evaluation, interval) where the recorded series ``page`` needs are there and fresh at
    ``now`` (else None), and why they do not cover a range from ``lo`` (None: they do; ``BEGAN_LATE``: they run, but
    began inside it)."""
    present = reader._present()
    if present is not None and not set(rec.PAGE_NEEDS[page]) <= present:
        return None, "no recording rules loaded"
    try:
        clock = _clock(reader.client, lo, now)
    except PromQueryError:
        clock = None
    if clock is None:  # the names held lately (present) but no evaluation in the window: they stopped
        return None, "no recording rules loaded" if present is None else "the recording rules are not evaluated"
    if now - clock[1] > STALE_INTERVALS * clock[2]:
        return None, "the recording rules are not evaluated"
    return clock, BEGAN_LATE if clock[0] > lo + 2 * clock[2] else None


def covers(reader: PromReader, page: str, lo: float, now: float) -> tuple[float, float, float] | None:
    """The rules' (first, last evaluation, interval) where the recorded series ``page`` needs are there, fresh at
    ``now`` and evaluated since ``lo``; if not, None, and why in ``reader.recording``."""
    clock, why = clock_at(reader, page, lo, now)
    return noted(reader, page, None if why else clock, why)


def noted(
    reader: PromReader, page: str, clock: tuple[float, float, float] | None, why: str | None
) -> tuple[float, float, float] | None:
    """``clock``, with ``page`` noted in ``reader.recording`` as read raw (for ``why``) or not."""
    if why is not None or clock is None:
        reader.recording.missing[page] = why or "no recording rules loaded"
        return None
    reader.recording.missing.pop(page, None)
    return clock


JOB_HELD: Final = f"sum by (job_id) ({rec.JOB_GPUS})"  # the GPUs each job holds, as of the rules' evaluation


def job_sums(reader: PromReader, lo: float, hi: float, step: float, held_from: float) -> jobquery.Summaries:
    """Every job's sums over (``lo``, ``hi``] from the recorded per-interval sums of the rules' evaluations in it (each
    covers the interval before it), the GPUs held at each step from ``held_from`` (none past ``hi``; the rules
    evaluated by then), and its (job, GPU) pairs from the raw membership series; the caller checks that the rules
    cover it (``clock_at``)."""
    window = f"[{max(1, round(hi - lo))}s]"
    dcgm = any(reader._exists(n) for n in fam.DCGM_PRESENCE)
    stats = {
        "util_n": f"sum by (job_id) (sum_over_time({rec.JOB_UTIL_N}{window}))",
        "util_sum": f"sum by (job_id) (sum_over_time({rec.JOB_UTIL_SUM}{window}))",
        "util_sq": f"sum by (job_id) (sum_over_time({rec.JOB_UTIL_SQ}{window}))",
        "mem_n": f"sum by (job_id) (sum_over_time({rec.JOB_MEM_N}{window}))",
        "mem_sum": f"sum by (job_id) (sum_over_time({rec.JOB_MEM_SUM}{window}))",
        "mem_max": f"max by (job_id) (max_over_time({rec.JOB_MEM_MAX}{window}))",
    }
    client = reader.client
    out = jobquery.Summaries(step)
    with ThreadPoolExecutor(4) as pool:
        pairs = pool.submit(client.query, jobquery.pairs_query(None, lo, hi, dcgm=dcgm), hi)
        held = pool.submit(client.query_range, JOB_HELD, held_from, hi, step) if held_from <= hi else None
        answers = {tag: pool.submit(client.query, q, hi) for tag, q in stats.items()}
        out.add_pairs(pairs.result())
        if held is not None:
            out.add_held(held.result())
        for tag, answer in answers.items():
            for s in answer.result():
                entry = out.jobs.get(s.labels.get("job_id", ""))
                if entry is not None and math.isfinite(s.value):
                    entry.stats[tag] = s.value
    return out


# each node's totals: NodeTotals's field -> the recorded name
_TOTALS: Final = {
    "up": rec.NODE_UP,
    "busy": rec.NODE_BUSY,
    "idle": rec.NODE_IDLE,
    "allocated_idle": rec.NODE_ALLOCATED_IDLE,
    "utilization_ratio_sum": rec.NODE_UTILIZATION,
    "memory_used_bytes": rec.NODE_MEMORY_USED,
    "memory_total_bytes": rec.NODE_MEMORY_TOTAL,
    "power_watts": rec.NODE_POWER,
    "power_limit_watts": rec.NODE_POWER_LIMIT,
}


def _now(reader: PromReader, page: str, now: float) -> tuple[float, float, float] | None:
    """The rules' clock where ``page``'s recorded series of the cluster now can be read at ``now`` (an instant query
    finds them: the rules run more often than its lookback)."""
    clock = covers(reader, page, now, now)
    if clock is not None and clock[2] >= LOOKBACK_S:
        reader.recording.missing[page] = f"the recording rules run less often than every {LOOKBACK_S:g} s"
        return None
    return clock


def node_totals(reader: PromReader, now: float) -> list[NodeTotals] | None:
    """Every node's totals from its recorded series of the rules' last evaluation (one query: a series per node and
    name), with that evaluation's time; None when the rules do not run (or run less often than an instant query
    looks back: their series are then not there between evaluations)."""
    clock = _now(reader, "overview", now)
    if clock is None:
        return None
    by_node: dict[str, dict[str, float]] = {}
    field_of = {name: f for f, name in _TOTALS.items()}
    for s in reader.client.query(fam.selector(_TOTALS.values()), now):
        node, f = s.labels.get("node", ""), field_of.get(s.labels.get("__name__", ""))
        if node and f is not None and math.isfinite(s.value):
            by_node.setdefault(node, {})[f] = s.value
    if not by_node:
        return None
    return [
        NodeTotals(
            node=node,
            timestamp=clock[1],
            up=round(values.get("up", 0.0)),
            busy=round(values.get("busy", 0.0)),
            idle=round(values.get("idle", 0.0)),
            allocated_idle=round(values.get("allocated_idle", 0.0)),
            utilization_ratio_sum=values.get("utilization_ratio_sum", 0.0),
            memory_used_bytes=values.get("memory_used_bytes", 0.0),
            memory_total_bytes=values.get("memory_total_bytes", 0.0),
            power_watts=values.get("power_watts", 0.0),
            power_limit_watts=values.get("power_limit_watts", 0.0),
        )
        for node, values in sorted(by_node.items())
    ]


def _loads(answer: list[PromSeries]) -> list[LinkLoad]:
    """Every GPU's link loads from the recorded series (a series per GPU and link); a GPU with one link's series only
    reads 0 of the other."""
    found: dict[str, tuple[str, int, dict[str, float]]] = {}
    for s in answer:
        uuid, gpu = s.labels.get("uuid", ""), s.labels.get("gpu", "")
        if uuid and gpu.isdigit() and math.isfinite(s.value):
            found.setdefault(uuid, (s.labels.get("node", ""), int(gpu), {}))[2][s.labels.get("link", "")] = s.value
    loads = [
        LinkLoad(node, gpu, uuid, ratios.get("pcie", 0.0), ratios.get("nvlink", 0.0))
        for uuid, (node, gpu, ratios) in found.items()
    ]
    return sorted(loads, key=lambda load: (load.node, load.gpu))


def link_summary(reader: PromReader, now: float, top: int) -> LinkSummary | None:
    """The interconnect page's view of every GPU: the recorded link loads, and the GPUs to read whole, as of the
    rules' last evaluation (recorded, a series per GPU named): those with degraded links (``rec.link_degraded``) and
    the ``top`` by link errors counted; each model's most NVLinks active now, and each node's newest sample of ``up``
    (the sample times ``latest_readings`` tells; a series per node). None where the loads are not recorded, or where
    the store holds dcgm-exporter families (the filters are over gpulens's)."""
    if any(reader._exists(n) for n in fam.DCGM_PRESENCE):
        return None
    clock = _now(reader, "interconnect", now)
    if clock is None:
        return None
    queries = {
        "loads": rec.GPU_LINK_LOAD,
        "degraded": f"{rec.GPU_LINK_DEGRADED} > 0",
        "worst": f"group by (uuid) (topk({top}, {rec.GPU_LINK_ERRORS} > 0))",
        "most": f"max by (model) ({fam.field_selector('nvlink_links_active')})",
        "newest": f"max by (node) (timestamp({fam.UP}))",
    }
    with ThreadPoolExecutor(len(queries)) as pool:  # at once
        asked = {tag: pool.submit(reader.client.query, q, now) for tag, q in queries.items()}
        answers = {tag: answer.result() for tag, answer in asked.items()}
    named = sorted({u for tag in ("degraded", "worst") for s in answers[tag] if (u := s.labels.get("uuid"))})
    best_links = {s.labels.get("model", ""): round(s.value) for s in answers["most"] if math.isfinite(s.value)}
    seen = {node: s.value for s in answers["newest"] if (node := s.labels.get("node")) and math.isfinite(s.value)}
    return LinkSummary(clock[1], _loads(answers["loads"]), named, best_links, seen)


def unsteady_links(reader: PromReader, lo: float, hi: float) -> set[str] | None:
    """The GPUs whose count of active NVLinks changed in (``lo``, ``hi``] or stood below their model's most (a
    superset of those with a link down in the range: ``link_outages`` reads them link by link): recorded over the
    rules' evaluations in the range (``rec.links_unsteady``), raw where those do not reach: the changes after the
    last evaluation (from an interval before it on), and, where the rules began inside the range, those before the
    first. None when the rules do not run."""
    now = reader.clock.now()
    clock, why = clock_at(reader, "interconnect", lo, now)
    began = clock is not None and why == BEGAN_LATE and clock[0] < hi
    if noted(reader, "interconnect", clock, None if began else why) is None or clock is None:
        return None
    first, last, interval = clock
    since = first if began else lo
    count = fam.LINKS_ACTIVE
    # raw: changes(), one selection of every count where max_over_time > min_over_time takes two (43 against 92 ms at
    # 8,000 GPUs); MetricsQL's also counts a window's first sample where none came before it: a superset
    queries = [  # (PromQL, at)
        (f"max_over_time({rec.GPU_LINKS_UNSTEADY}[{round(max(hi - since, interval)) + 1}s]) > 0", hi),
        (f"changes({count}[{round(max(hi - last, 0.0) + 2 * interval)}s]) > 0", hi),
    ]
    if began:
        queries.append((f"changes({count}[{max(1, round(first - lo))}s]) > 0", first))
    with ThreadPoolExecutor(len(queries)) as pool:
        answers = [pool.submit(reader.client.query, q, at) for q, at in queries]
        return {u for answer in answers for s in answer.result() if (u := s.labels.get("uuid"))}


def nic_problems(reader: PromReader, start: float, end: float) -> dict[str, tuple[str, ...]] | None:
    """Every port's problems from its recorded flags now and its errors over [start, end]: recorded where the rules
    ran, and where they began inside the range, raw before their first evaluation (``problems.rose_ports``); None
    when the rules do not run."""
    now = reader.clock.now()
    clock, why = clock_at(reader, "interconnect ports", start, now)
    began = clock is not None and why == BEGAN_LATE and clock[0] < end
    if noted(reader, "interconnect ports", clock, None if began else why) is None:
        return None
    first = clock[0] if clock is not None and began else start
    window = f"[{max(1, round(end - first))}s]"
    with ThreadPoolExecutor(3) as pool:
        flags = pool.submit(reader.client.query, rec.PORT_FLAGS, now)
        errors = pool.submit(reader.client.query, f"max_over_time({rec.PORT_ERRORS}{window}) > 0", now)
        if began:  # the span before the rules' first evaluation, raw at nic_series's steps
            lo, _, step = reader._step(start, end, ERROR_POINTS)
            before = pool.submit(problems.rose_ports, reader, lo, first - step, step)
        rose = {key for s in errors.result() if (key := _nic_key(s.labels)) is not None}
        if began:
            rose |= before.result()
        found: dict[str, tuple[str, ...]] = {}
        for s in flags.result():
            key = _nic_key(s.labels)
            if key is None or not math.isfinite(s.value):
                continue
            bits = round(s.value)
            told = {name for name, bit in rec.FLAG_BITS if bits & bit} | ({"errors"} if key in rose else set())
            found[nic_id(*key)] = tuple(p for p in PORT_PROBLEMS if p in told)
    return found


def status(client: PromClient, now: float) -> tuple[float | None, list[tuple[str, str, float | None]]]:
    """The rules' interval (None: not evaluated lately) and, per recorded name, ("present" | "stale" | "missing",
    the age of its newest sample in seconds, None when older than Prometheus's lookback): stale when older than
    ``STALE_INTERVALS`` intervals, missing when the store holds no sample of it in the last 8 days."""
    names = rec.names()
    held = client.metric_names(now - 8 * 86400.0, now)
    # timestamp() of each name's own selector, tagged with the name after: MetricsQL answers timestamp() of an
    # expression that is not a selector (a label_replace of one) as a subquery, at step-aligned times, not the samples'
    newest_of = " or ".join(f'label_replace(max(timestamp({name})), "gl_name", "{name}", "", "")' for name in names)
    newest = {s.labels.get("gl_name", ""): s.value for s in client.query(newest_of, now)}
    interval = None
    for s in client.query(rec.CLOCK, now):
        text = s.labels.get("interval", "").removesuffix("s")
        interval = float(text) if text.isdigit() else float(rec.INTERVAL_S)
    stale_after = STALE_INTERVALS * (interval or rec.INTERVAL_S)
    out: list[tuple[str, str, float | None]] = []
    for name in names:
        if name not in held:
            out.append((name, "missing", None))
            continue
        age = max(0.0, now - newest[name]) if name in newest else None
        out.append((name, "present" if age is not None and age <= stale_after else "stale", age))
    return interval, out
