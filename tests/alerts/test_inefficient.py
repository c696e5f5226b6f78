"""JobInefficient: a job that holds its GPUs mostly idle is told so; a busy or mostly busy job is not."""

from __future__ import annotations

from gpulens.alerts.catalogue import JOB_INEFFICIENT
from gpulens.alerts.inefficient import job_inefficient
from gpulens.model import GpuReading
from tests.alerts.support import STEP, Feed, healthy_gpu, job_snapshot, rule, training

ROUNDS = 40


def idle(node: str, index: int) -> GpuReading:
    return healthy_gpu(node, index, utilization_ratio=0.0)


def test_a_job_whose_gpus_stay_idle_holds_from_its_first_round_and_waits_its_for() -> None:
    inefficient = rule(JOB_INEFFICIENT)
    assert inefficient.severity == "info"
    assert inefficient.for_s == 1800.0  # "for half an hour on end" is the engine's pending time
    feed = Feed()
    feed.add([job_snapshot("node-00", idle, range(4), job="notebook", user="carol")])
    (candidate,) = feed.candidates([inefficient])
    assert candidate.labels["job_id"] == "notebook"
    assert candidate.labels["user"] == "carol"
    assert candidate.value == 1.0
    assert "4 GPU(s) idle 100%" in candidate.summary


def test_a_busy_job_and_a_mostly_busy_one_stay_silent() -> None:
    inefficient = rule(JOB_INEFFICIENT)
    feed = Feed()

    def half_idle(node: str, index: int) -> GpuReading:
        return idle(node, index) if index < 2 else training(node, index)  # 50% idle, below idle_ratio 0.8

    for _ in range(ROUNDS):
        feed.add(
            [
                job_snapshot("node-00", training, range(4), job="busy"),
                job_snapshot("node-01", half_idle, range(4), job="half"),
            ]
        )
        assert feed.candidates([inefficient]) == []


def test_the_share_counts_the_window_and_a_busy_spell_silences_it() -> None:
    inefficient = rule(JOB_INEFFICIENT)
    feed = Feed(window_s=ROUNDS * STEP)
    for _ in range(ROUNDS):
        feed.add([job_snapshot("node-00", idle, range(2), job="late-start")])
    assert [c.labels["job_id"] for c in feed.candidates([inefficient])] == ["late-start"]
    holds = []
    for _ in range(ROUNDS):  # it starts working: once about a fifth of the window is busy, the share is below 0.8
        feed.add([job_snapshot("node-00", training, range(2), job="late-start")])
        holds.append(bool(feed.candidates([inefficient])))
    silent_from = holds.index(False)
    assert 1 <= silent_from <= ROUNDS // 5 + 1
    assert not any(holds[silent_from:])


def test_counting_round_by_round_gives_what_the_window_gives() -> None:
    """Judged every round (counts carried in the memo) or only now (counted from the window): the same share."""
    inefficient = rule(JOB_INEFFICIENT, idle_ratio=0.5)
    carried, fresh = Feed(window_s=10 * STEP), Feed(window_s=10 * STEP)
    for k in range(30):
        make = training if k % 3 == 0 else idle
        for feed in (carried, fresh):
            feed.add([job_snapshot("node-00", make, range(2), job="j")])
        carried_values = [c.value for c in job_inefficient(inefficient, carried.history, carried.now)]
    assert carried_values == [c.value for c in job_inefficient(inefficient, fresh.history, fresh.now)]
    assert carried_values
    assert 0.5 <= carried_values[0] < 1.0
