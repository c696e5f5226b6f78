"""Recording rules loaded inside the range read (``storage.prometheus.jobread``): a real Prometheus holding half an
hour of a simulated cluster, the recording rules' series backfilled over its second half only (as a Prometheus whose
rules were loaded 15 minutes ago holds them). The jobs page reads the recorded sums for the span they cover and the
raw series for the rest, and gives the job summaries the raw read gives.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Iterator

import pytest

from gpulens.clock import ManualClock  # now() and monotonic() both stand still
from gpulens.settings import StoreAuth
from gpulens.storage.prometheus import PromReader
from gpulens.storage.prometheus import recording as rec
from gpulens.storage.prometheus.client import LOOKBACK_S
from gpulens.storage.records import JOB_POINTS
from tests.prom import running_prometheus
from tests.storage.promblocks import backfill_rules, create_blocks, move_blocks
from tests.storage.test_prometheus_recording import sent_queries

STEP_S = 60
SAMPLES = 31  # half an hour
NODES = 8
FLAGS = ("--storage.tsdb.min-block-duration=2h", "--storage.tsdb.max-block-duration=2h")
RULES_FROM_S = 900  # the rules' first evaluation, after the history's start


@pytest.fixture(scope="module")
def end() -> int:
    return int(time.time()) // 7200 * 7200 - STEP_S


@pytest.fixture(scope="module")
def young(tmp_path_factory: pytest.TempPathFactory, prometheus_bin: str, promtool: str, end: int) -> Iterator[str]:
    """One Prometheus over half an hour of ``NODES`` nodes, the rules' series over its last quarter hour."""
    raw, work = tmp_path_factory.mktemp("raw"), tmp_path_factory.mktemp("young")
    start = end - (SAMPLES - 1) * STEP_S
    create_blocks(promtool, raw, NODES, start, STEP_S, SAMPLES)
    shutil.copytree(raw / "tsdb", work / "tsdb")
    rules = work / "rules.yml"
    rules.write_text(rec.rules_yaml(STEP_S, STEP_S))
    with running_prometheus(prometheus_bin, raw, {}, interval_s=STEP_S, flags=FLAGS) as base:
        backfill_rules(promtool, base, rules, start + RULES_FROM_S, end, work / "backfilled")
    assert move_blocks(work / "backfilled", work / "tsdb") >= 1
    with running_prometheus(prometheus_bin, work, {}, interval_s=STEP_S, flags=FLAGS) as base:
        yield base


def reader(base: str, at: float, *, use_recorded: bool = True) -> tuple[PromReader, list[str]]:
    """A reader at ``at`` and the PromQL it sends, in order."""
    got = PromReader(
        "prometheus+" + base, StoreAuth(min_step_s=STEP_S), clock=ManualClock(at), use_recorded=use_recorded
    )
    return got, sent_queries(got)


def close(a: float | None, b: float | None, rel: float) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-9)


def test_a_range_half_covered_reads_recorded_sums_for_its_covered_span(young: str, end: int) -> None:
    at = end + 30
    start = at - 1800
    fast, sent = reader(young, at)
    got = {j.job_id: j for j in fast.jobs(start, at)}
    assert fast.recording.missing == {}  # read recorded where it could, so no hint to load the rules
    slow, raw_sent = reader(young, at, use_recorded=False)
    want = {j.job_id: j for j in slow.jobs(start, at)}
    assert got.keys() == want.keys()
    assert len(got) >= 4
    turned = {j for j in got if j.endswith(("a", "b")) or "a-" in j or "b-" in j}
    step = 1800 / JOB_POINTS + 3
    for job, mine in got.items():
        theirs = want[job]
        assert (mine.gpus, mine.nodes, mine.user) == (theirs.gpus, theirs.nodes, theirs.user), job
        # a job that ended is held in the raw read's steps for Prometheus's lookback after its last sample; in the
        # recorded counts, for an interval
        late = LOOKBACK_S if job in turned else 0.0
        assert abs(mine.gpu_hours - theirs.gpu_hours) <= len(mine.gpus) * (step + late) / 3600, job
        assert abs(mine.first_seen - theirs.first_seen) <= step
        assert abs(mine.last_seen - theirs.last_seen) <= step + late
        rel = 0.02 if job in turned else 1e-6  # a job that came or went: the raw read's per-step means
        assert close(mine.utilization_ratio_mean, theirs.utilization_ratio_mean, rel), job
        assert close(mine.utilization_ratio_stddev, theirs.utilization_ratio_stddev, 0.25 if job in turned else rel)
        assert close(mine.memory_used_bytes_mean, theirs.memory_used_bytes_mean, rel), job
        assert mine.memory_used_bytes_max == theirs.memory_used_bytes_max, job
    # the recorded sums read over the span the rules cover (from the interval before their first evaluation), the
    # raw statistics over the rest: windows that add up to the range
    recorded = [q for q in sent if rec.JOB_UTIL_SUM in q]
    assert len(recorded) == 1
    covered = int(recorded[0].split("[")[1].split("s]")[0])
    assert abs(covered - (RULES_FROM_S + STEP_S + (at - end))) <= 2 * STEP_S
    raw_stats = [q for q in sent if "stddev_over_time(gpulens_gpu_utilization_ratio" in q]
    assert len(raw_stats) == 1
    rest = int(raw_stats[0].split("[")[1].split("s]")[0])
    assert 1800 - 2 * 1800 / JOB_POINTS <= covered + rest <= 1800 + 2 * 1800 / JOB_POINTS
    assert any(rec.JOB_GPUS in q for q in sent)  # the GPUs held: recorded counts from the rules' first evaluation
    # both parts' queries, once each: no more than the two reads apart (the rules' clock and names aside)
    assert len(sent) <= len(raw_sent) + 9
    assert not any(rec.JOB_UTIL_SUM in q for q in raw_sent)


def test_a_range_mostly_before_the_rules_reads_raw_without_a_hint(young: str, end: int) -> None:
    """Rules that cover less than half the range (here 16 minutes of 50) do not pay for the split:
    the whole range is read raw, and no hint asks to load rules that are loaded."""
    at = end + 30
    fast, sent = reader(young, at)
    got = {j.job_id: j for j in fast.jobs(at - 3000, at)}
    assert not any(rec.JOB_UTIL_SUM in q or rec.JOB_GPUS in q for q in sent)
    assert "jobs" not in fast.recording.missing
    slow, _ = reader(young, at, use_recorded=False)
    assert got == {j.job_id: j for j in slow.jobs(at - 3000, at)}
    assert len(got) >= 4


def test_a_range_before_the_rules_reads_raw_and_says_why(young: str, end: int) -> None:
    at = end - RULES_FROM_S - 300  # the rules had not begun: raw only
    fast, sent = reader(young, end + 30)
    fast.jobs(at - 600, at)
    assert not any(rec.JOB_UTIL_SUM in q for q in sent)
    assert "began after" in fast.recording.missing["jobs"]


def test_port_problems_half_covered_read_recorded_flags_and_raw_errors_before_them(young: str, end: int) -> None:
    at = end - 30  # the flags are as old as the rules' last evaluation: read where both saw the same scrape
    fast, sent = reader(young, at)
    got = fast.nic_problems(at - 1800, at)
    assert "interconnect ports" not in fast.recording.missing
    slow, _ = reader(young, at, use_recorded=False)
    want = slow.nic_problems(at - 1800, at)
    assert got == want
    assert len(got) >= NODES
    assert any("errors" in found for found in got.values())
    assert sum(rec.PORT_ERRORS in q for q in sent) == 1  # the errors since the rules' first evaluation, recorded
    assert sum(q.startswith("rate(") and q.endswith("> 0") for q in sent) >= 1  # before it, raw
