"""JobInefficient: a job that held its GPUs mostly idle is told so; a busy or a young job is not."""

from __future__ import annotations

from gpulens.alerts.catalogue import JOB_INEFFICIENT
from tests.alerts.support import STEP, Feed, healthy_gpu, job_snapshot, rule, training

HELD_S = 300.0


def idle(node: str, index: int) -> object:
    return healthy_gpu(node, index, utilization_ratio=0.0)


def test_a_job_whose_gpus_stay_idle_fires_once_it_has_held_them_long_enough() -> None:
    inefficient = rule(JOB_INEFFICIENT, held_s=HELD_S)
    feed = Feed()
    rounds = int(HELD_S / STEP)
    for _ in range(rounds):
        feed.add([job_snapshot("node-00", idle, range(4), job="notebook", user="carol")])
        assert feed.candidates([inefficient]) == []  # not held for held_s yet
    feed.add([job_snapshot("node-00", idle, range(4), job="notebook", user="carol")])
    (candidate,) = feed.candidates([inefficient])
    assert candidate.labels["job_id"] == "notebook"
    assert candidate.labels["user"] == "carol"
    assert candidate.labels["severity"] == "info"
    assert candidate.value == 1.0
    assert "4 GPU(s) idle 100%" in candidate.summary


def test_a_busy_job_and_a_mostly_busy_one_stay_silent() -> None:
    inefficient = rule(JOB_INEFFICIENT, held_s=HELD_S)
    feed = Feed()

    def half_idle(node: str, index: int) -> object:
        return idle(node, index) if index < 2 else training(node, index)  # 50% idle, below idle_ratio 0.8

    for _ in range(int(HELD_S / STEP) * 2):
        feed.add(
            [
                job_snapshot("node-00", training, range(4), job="busy"),
                job_snapshot("node-01", half_idle, range(4), job="half"),
            ]
        )
    assert feed.candidates([inefficient]) == []


def test_the_share_counts_the_jobs_whole_life_and_a_busy_spell_silences_it() -> None:
    inefficient = rule(JOB_INEFFICIENT, held_s=HELD_S)
    feed = Feed()
    for _ in range(int(HELD_S / STEP) + 1):
        feed.add([job_snapshot("node-00", idle, range(2), job="late-start")])
    assert [c.labels["job_id"] for c in feed.candidates([inefficient])] == ["late-start"]
    # It starts working: after as many busy rounds again, only half of its readings were idle.
    for _ in range(int(HELD_S / STEP) + 1):
        feed.add([job_snapshot("node-00", training, range(2), job="late-start")])
    assert feed.candidates([inefficient]) == []
