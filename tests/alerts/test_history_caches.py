"""What ``History`` works out once per round for every rule (up GPUs, a window's first reading, the memo) follows
each new round, and gives what the per-GPU series give; a single-GPU job's summary is the general one's."""

from __future__ import annotations

import dataclasses
import math
import statistics

from hypothesis import given, settings
from hypothesis import strategies as st

from gpulens.alerts.fabrichistory import REFERENCE_FIT_RATIO, REFERENCE_SETTLED_ROUNDS, _Reference
from gpulens.alerts.history import summarise_job
from gpulens.model import GpuReading

from .support import STEP, Feed, healthy_gpu, snapshot, uuid


def test_reading_since_finds_the_oldest_reading_in_the_window_when_the_gpu_skipped_rounds() -> None:
    feed = Feed(window_s=120.0)
    both = [healthy_gpu(index=0, utilization_ratio=0.1), healthy_gpu(index=1, utilization_ratio=0.1)]
    feed.add([snapshot("node-00", both)])
    feed.add([snapshot("node-00", both[:1])])  # GPU 1 missing from this round
    feed.add([snapshot("node-00", [healthy_gpu(index=0), healthy_gpu(index=1, utilization_ratio=0.3)])])
    history = feed.history
    since = feed.now - STEP - 1.0  # the first round at or after it lacks GPU 1
    found = history.reading_since(uuid("node-00", 1), since)
    assert found is not None
    assert found[0] == feed.now
    assert found[1].utilization_ratio == 0.3
    zero = history.reading_since(uuid("node-00", 0), since)
    assert zero is not None
    assert zero[0] == feed.now - STEP
    for gpu in (0, 1):  # the same answer as a search of the GPU's own series
        series = history.series(uuid("node-00", gpu))
        assert history.reading_since(uuid("node-00", gpu), since) == next(e for e in series if e[0] >= since)
    assert history.reading_since(uuid("node-00", 0), feed.now + 1.0) is None
    assert history.reading_since("GPU-unknown", since) is None


def test_up_gpus_and_the_memo_follow_each_round() -> None:
    feed = Feed()
    feed.add([snapshot("node-00", [healthy_gpu(index=0), healthy_gpu(index=1)], {0: ("train", "alice")})])
    history = feed.history
    assert [(r.gpu, [j.job_id for j in jobs]) for r, jobs in history.up_gpus()] == [(0, ["train"]), (1, [])]
    history.memo()["key"] = 1
    lost = GpuReading(node="node-00", gpu=1, uuid=uuid("node-00", 1), model="m", timestamp=0.0, up=False)
    feed.add([snapshot("node-00", [healthy_gpu(index=0), lost])])
    assert [r.gpu for r, _ in history.up_gpus()] == [0]
    assert history.lost_gpus() == {uuid("node-00", 1)}
    assert history.memo() == {}


def test_a_single_gpu_jobs_summary_is_what_the_general_summary_gives() -> None:
    for reading in (
        healthy_gpu(),
        healthy_gpu(utilization_ratio=0.02, sm_clock_hertz=0, power_watts=None, memory_used_bytes=None),
        GpuReading(node="n", gpu=0, uuid="u", model="m", timestamp=0.0),
    ):
        one = summarise_job(100.0, [reading])
        two = summarise_job(100.0, [reading, reading])  # the general path: medians of equal values
        assert one == dataclasses.replace(two, gpus=1)


@settings(max_examples=200, deadline=None)
@given(
    rounds=st.lists(
        st.tuples(st.floats(0.5, 30.0), st.one_of(st.none(), st.floats(0.0, 1e6), st.sampled_from([0.0, 2.0, 2.0]))),
        max_size=60,
    )
)
def test_a_ports_reference_median_is_the_median_of_its_values(rounds: list[tuple[float, float | None]]) -> None:
    """The reference's median is ``statistics.median`` of the finite values of the rounds it holds, as rounds come and
    old ones leave it (gaps of 0.5-30 s against a 60 s window), and a value far above its usual level stays out."""
    reference = _Reference()
    now = 0.0
    held: list[tuple[float, float]] = []  # (time, value) the reference should hold, kept here the plain way
    for gap, value in rounds:
        now += gap
        usual_before = reference.usual
        reference.note(now, value, 60.0)
        if value is not None and math.isfinite(value):
            usual = reference.usual if len(held) >= REFERENCE_SETTLED_ROUNDS and value > 1.0 else None
            if usual is None or value <= REFERENCE_FIT_RATIO * usual:
                held.append((now, value))
                held = [(t, v) for t, v in held if t >= now - 60.0]
        kept = [v for _, v in held]
        assert list(reference.values) == kept
        assert list(reference.times) == [t for t, _ in held]
        assert reference.median() == (statistics.median(kept) if kept else None)
        if usual_before is not None and reference.usual != usual_before:
            assert reference.age <= 1  # refreshed this round
