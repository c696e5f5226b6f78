"""The Prometheus backend's query cost is bounded by the page, not the cluster: each dashboard page makes the same
number of queries over 4 nodes as over 12 (with three times the GPUs and jobs), and the job summaries are one
query, aggregated by job in Prometheus, whose answer agrees with summing the per-GPU series by hand.

The history is backfilled TSDB blocks (``tests.storage.promblocks``, the bench's generator) served by a real
Prometheus, then the same samples imported into a real VictoriaMetrics: every test runs over both.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpulens.clock import ManualClock  # now() and monotonic() both stand still
from gpulens.settings import StoreAuth
from gpulens.storage.prometheus import PromReader
from gpulens.storage.records import JOB_POINTS
from tests.prom import running_prometheus, running_victoriametrics
from tests.storage.promblocks import create_blocks, import_history, layout

STEP_S = 60
SAMPLES = 31  # half an hour
FLAGS = ("--storage.tsdb.min-block-duration=2h", "--storage.tsdb.max-block-duration=2h")


@pytest.fixture(scope="module")
def end() -> int:
    return int(time.time()) // 7200 * 7200 - STEP_S


@pytest.fixture(scope="module", params=["prometheus", "victoriametrics"])
def readers(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    prometheus_bin: str,
    victoriametrics_bin: str,
    end: int,
) -> Iterator[dict[int, PromReader]]:
    """Readers over two stores holding the same half hour of 4 and of 12 nodes: Prometheus servers (TSDB blocks),
    then VictoriaMetrics servers (the same samples imported)."""
    from contextlib import ExitStack

    out = {}
    start = end - (SAMPLES - 1) * STEP_S
    with ExitStack() as stack:
        for nodes in (4, 12):
            work = tmp_path_factory.mktemp(f"{request.param}{nodes}")
            if request.param == "prometheus":
                create_blocks("promtool", work, nodes, start, STEP_S, SAMPLES)
                base = stack.enter_context(running_prometheus(prometheus_bin, work, {}, interval_s=STEP_S, flags=FLAGS))
            else:
                base = stack.enter_context(running_victoriametrics(victoriametrics_bin, work, {}, interval_s=STEP_S))
                import_history(base, nodes, start, STEP_S, SAMPLES)
            out[nodes] = PromReader("prometheus+" + base, StoreAuth(min_step_s=STEP_S), clock=ManualClock(end + 30))
        yield out


def pages(store: PromReader) -> dict[str, Callable[[], Any]]:
    from gpulens.dashboard.components import ViewState
    from gpulens.dashboard.context import Context
    from gpulens.dashboard.grid import DEFAULT_SORT
    from gpulens.dashboard.heatmaps import DEFAULT_METRIC
    from gpulens.dashboard.pages import gpu, interconnect, job, jobs, node, overview

    context = Context(db=store, clock=store.clock)
    state = ViewState(range="1h")
    some = store.latest_readings(node="node-0001")[0].uuid
    return {
        "overview": lambda: overview.render(context, state, DEFAULT_METRIC, DEFAULT_SORT, "", 1),
        "jobs": lambda: jobs.render(context, state, "all", "", 1),
        "job": lambda: job.render(context, state, "job-1"),
        "node": lambda: node.render(context, state, "node-0001"),
        "gpu": lambda: gpu.render(context, state, some),
        "interconnect": lambda: interconnect.render(context, state, "node-0001"),
    }


def counters(store: PromReader) -> tuple[int, int]:
    """The client's (queries, series) so far, after the reader's list of metric names is read: pytest-xdist may hand
    a test the module's readers fresh, and their first read of those names would count as one query more."""
    store.present_names()
    return store.client.stats.queries, store.client.stats.series


def queries_of(store: PromReader, load: Callable[[], Any]) -> int:
    before = counters(store)[0]
    load()
    return store.client.stats.queries - before


def test_queries_per_page_do_not_grow_with_the_gpus_or_the_jobs(readers: dict[int, PromReader], end: int) -> None:
    small, large = readers[4], readers[12]
    assert len(large.latest_readings()) == 3 * len(small.latest_readings()) == 96
    assert len(large.jobs(end - 3600, end)) > len(small.jobs(end - 3600, end)) >= 2
    counts = {size: {name: queries_of(r, load) for name, load in pages(r).items()} for size, r in readers.items()}
    assert counts[4] == counts[12]
    assert all(0 < n <= 40 for n in counts[12].values()), counts[12]


def test_job_summaries_are_a_fixed_number_of_queries_answered_by_job(readers: dict[int, PromReader], end: int) -> None:
    cost = {}
    for nodes, store in readers.items():
        before = counters(store)
        summaries = store.jobs(end - 1800, end)
        cost[nodes] = (store.client.stats.queries - before[0], store.client.stats.series - before[1])
        expected = {job for held in layout(nodes, SAMPLES).jobs.values() for job, *_ in held}
        assert {s.job_id for s in summaries} == expected
        one = store.jobs(end - 1800, end, job_id="job-1")
        assert one == [s for s in summaries if s.job_id == "job-1"]
    # the same queries whatever the cluster (both have GPUs that changed jobs: 12 with them, 8 without) ...
    assert cost[4][0] == cost[12][0] <= 12
    # ... and answers that grow with the GPUs, not with the samples: at most a few series per GPU
    assert cost[12][1] <= 96 * 10


def test_job_summaries_agree_with_the_per_gpu_series_summed_by_hand(readers: dict[int, PromReader], end: int) -> None:
    """The aggregate PromQL against the plain per-GPU reads (every step's mean of each GPU the job held then):
    GPU-hours and first and last step exactly; utilization and memory (from every sample of the GPUs a job held
    throughout, from each step's means for those that changed jobs) within 2 %."""
    store = readers[12]
    start = end - 1800
    lo, hi, step = store._step(start, end, JOB_POINTS + 1)
    summaries = {s.job_id: s for s in store.jobs(start, end)}
    # who held what at each step: the job info series, read per GPU at the same steps
    held = store.client.query_range("gpulens_gpu_job_info", lo + step, hi, step)
    data = store.series(None, ["utilization_ratio", "memory_used_bytes"], lo, hi, round((hi - lo) / step) + 1)
    compared = 0
    for job_id, summary in summaries.items():
        steps = [(s.labels["uuid"], t - step) for s in held if s.labels["job_id"] == job_id for t, _ in s.samples]
        assert summary.gpu_hours == pytest.approx(len(steps) * step / 3600)
        util = [v for uuid, t in steps if (v := _at(data[uuid], "utilization_ratio", t)) is not None]
        memory = [v for uuid, t in steps if (v := _at(data[uuid], "memory_used_bytes", t)) is not None]
        peak = max(v for uuid, t in steps if (v := _at(data[uuid], "memory_used_bytes", t, top=True)) is not None)
        mean = sum(util) / len(util)
        assert summary.utilization_ratio_mean == pytest.approx(mean, rel=0.02)
        spread = math.sqrt(max(0.0, sum(u * u for u in util) / len(util) - mean * mean))
        assert summary.utilization_ratio_stddev == pytest.approx(spread, abs=0.02)
        assert summary.memory_used_bytes_mean == pytest.approx(sum(memory) / len(memory), rel=0.02)
        assert summary.memory_used_bytes_max == pytest.approx(peak, rel=0.02)
        assert summary.first_seen == min(t for _, t in steps)
        assert summary.last_seen == max(t for _, t in steps) + step
        compared += 1
    assert compared == len(summaries) >= 4  # job-0, job-1, job-2a and job-2b (its turnover halfway)


def test_link_outages_are_found_from_the_count_of_active_links(readers: dict[int, PromReader], end: int) -> None:
    """Link by link only for GPUs whose count changed or is below their model's: both outages, and nothing else."""
    store = readers[12]
    start = end - (SAMPLES - 1) * STEP_S
    outages = store.link_outages(start, end + STEP_S)
    found = {(o.node, o.gpu, o.link, o.until is None) for o in outages}
    assert found == {("node-0002", 3, 5, True), ("node-0005", 0, 0, True)}
    halfway = next(o for o in outages if o.node == "node-0002")
    assert start + (SAMPLES // 2 - 1) * STEP_S <= halfway.since <= start + (SAMPLES // 2 + 1) * STEP_S
    assert next(o for o in outages if o.node == "node-0005").since <= start + STEP_S
    # before the first outage began, only the link down all along (fewer active links than its model's others)
    assert {(o.node, o.gpu, o.link) for o in store.link_outages(start, start + 10 * STEP_S)} == {("node-0005", 0, 0)}


def _at(series: Any, field: str, t: float, *, top: bool = False) -> float | None:
    if t not in series.timestamps:
        return None
    values = series.maximum if top else series.values
    return values[field][series.timestamps.index(t)]  # type: ignore[no-any-return]


def test_the_overviews_fabric_reads_grow_with_the_nodes_shown_not_the_ports(readers: dict[int, PromReader]) -> None:
    """Every node's ports counted in Prometheus: one series per node and query, not one per port and field; the
    shown nodes' ports read whole: the same series whatever the cluster."""
    from gpulens.dashboard.fabric import STATUS_FIELDS

    cost = {}
    for nodes, store in readers.items():
        before = counters(store)
        counts = store.nic_counts()
        counted = (store.client.stats.queries - before[0], store.client.stats.series - before[1])
        every = store.latest_nics()
        assert counts == {
            node: (sum(n.up for n in every if n.node == node), sum(1 for n in every if n.node == node))
            for node in {n.node for n in every}
        }
        assert len(counts) == nodes
        before = counters(store)
        shown = store.latest_nics(nodes=["node-0001", "node-0002"], fields=STATUS_FIELDS)
        cost[nodes] = (counted, (store.client.stats.queries - before[0], store.client.stats.series - before[1]))
        assert shown == [n for n in store.latest_nics(fields=STATUS_FIELDS) if n.node in ("node-0001", "node-0002")]
    assert cost[4][0] == (2, 2 * 4)  # two queries, one series per node each
    assert cost[12][0] == (2, 2 * 12)
    assert cost[4][1] == cost[12][1]  # the shown nodes' ports: the same queries and series
    assert cost[12][1][0] == 4  # the ports' labels, the gauges in one selector, two rates


def test_the_ports_problems_told_in_promql_are_the_sql_paths(readers: dict[int, PromReader], end: int) -> None:
    """``nic_problems`` over Prometheus (the ports' state, rate and width, and the saturated ports and those with
    errors as PromQL comparisons) is what the SQL path's computation over every port's reading and error rates
    (``storage.portproblems.nic_problems``) says over the same store, in a fixed number of queries: four series per
    port (its labels, state, rate and width) and one per port and comparison that finds a problem, not every port's
    fields."""
    from gpulens.storage import portproblems

    for nodes, store in readers.items():
        before = counters(store)
        told = store.nic_problems(end - 1800, end)
        cost = (store.client.stats.queries - before[0], store.client.stats.series - before[1])
        assert told == portproblems.nic_problems(store, end - 1800, end)
        assert len(told) == 8 * nodes
        # the bench's history: every port's error counters grow, its link widths wobble, a few ports run near rate
        assert {p for found in told.values() for p in found} == {"degraded", "errors", "saturated"}
        saturated = sum(1 for found in told.values() if "saturated" in found)
        # errors: the ports whose counters stand above zero, and those whose each counter rose (here: all, thrice)
        assert cost == (9, 4 * len(told) + saturated + len(told) + 3 * len(told))
