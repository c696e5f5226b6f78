"""How ``Rollups.step`` sizes its slices: the ids of each step follow the measured cost per id, so no step's work
outgrows its budget (a fake timer charges a fixed cost per id rolled: work is bounded, not time)."""

from __future__ import annotations

from typing import Any

import pytest

from gpulens.storage.db import Database
from gpulens.storage.fabricschema import FAMILIES
from gpulens.storage.rollup import AIM, Rollups, next_slice
from gpulens.storage.writer import Writer
from tests.storage.test_rollup import START, _write_cluster_minutes

PER_ID_S = 0.001  # what the fake timer charges for each id a step rolls up
BUDGET_S = 0.05
FIT = round(BUDGET_S * AIM / PER_ID_S)  # the ids a step may roll within AIM of its budget: 20


def test_a_slow_step_shrinks_the_next_to_fit_at_once() -> None:
    assert next_slice(100, 0.1, BUDGET_S) == FIT  # 1 ms an id: 20 fit in 20 ms
    assert next_slice(100, 1.0, BUDGET_S) == 2
    assert next_slice(100, 10.0, BUDGET_S) == 1  # never below one


def test_a_fast_step_grows_the_next_by_half_at_most() -> None:
    assert next_slice(100, 0.001, BUDGET_S) == 150
    assert next_slice(18, 0.018, BUDGET_S) == 19  # halfway to the 20 that fit
    assert next_slice(100, 0.005, BUDGET_S, ids=5) == 60  # the rest of a family: 5 ids, 1 ms each


class Charged:
    """A timer that moves only when a step rolls ids up (``PER_ID_S`` each) or plans (``plan_s``)."""

    def __init__(self, plan_s: float = 0.0) -> None:
        self.now = 0.0
        self.plan_s = plan_s
        self.steps: list[tuple[str, str, int, bool]] = []  # tier, family, ids, planned in this step

    def __call__(self) -> float:
        return self.now


def _charging(rollups: Rollups, timer: Charged, monkeypatch: pytest.MonkeyPatch) -> None:
    roll, plan = rollups._roll, rollups._plan
    planned = [False]

    def charged_plan(*args: Any, **kwargs: Any) -> Any:
        timer.now += timer.plan_s
        planned[0] = True
        return plan(*args, **kwargs)

    def charged_roll(work: Any, g1: int) -> int:
        ids = min(g1, work.last_gpu + 1) - work.next_gpu
        timer.steps.append((work.tier.name, FAMILIES[work.family].name, ids, planned[0]))
        planned[0] = False
        timer.now += PER_ID_S * ids
        return int(roll(work, g1))

    monkeypatch.setattr(rollups, "_roll", charged_roll)
    monkeypatch.setattr(rollups, "_plan", charged_plan)


@pytest.mark.parametrize("plan_s", [0.0, 0.01])
def test_each_step_rolls_what_fits_its_budget(db: Database, monkeypatch: pytest.MonkeyPatch, plan_s: float) -> None:
    """60 GPUs over 62 minutes, a first slice of 64: after each kind's first step, every step rolls at most the
    ids that fit (20), fewer when planning a bucket took part of the step (10 ms: 10 ids)."""
    _write_cluster_minutes(Writer(db), 0, 62, nodes=30)
    timer = Charged(plan_s)
    rollups = Rollups(db, settle_s=0, slice_gpus=64, timer=timer)
    _charging(rollups, timer, monkeypatch)
    while rollups.step(START + 62 * 60, max_seconds=BUDGET_S):
        pass
    seen: set[tuple[str, str]] = set()
    later = []
    for tier, family, ids, planned in timer.steps:
        if (tier, family) in seen:
            later.append((ids, planned))
        seen.add((tier, family))
    assert len(later) > 62  # several slices a bucket
    assert max(ids for ids, _ in later) <= FIT
    planning = [ids for ids, planned in later if planned]
    assert planning
    assert max(planning) <= FIT - round(plan_s / PER_ID_S)
    gpu_minutes = sum(ids for tier, family, ids, _ in timer.steps if (tier, family) == ("1m", "gpu"))
    assert gpu_minutes == 60 * 62  # every GPU of every minute, once
