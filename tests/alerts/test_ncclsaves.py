"""What a job's saves teach ``CommunicationStall`` (``alerts.ncclsaves``): only a spell behind whose ranks were busy
in every round judged and that ended with them caught up; the ceiling it gives; and the same log whether carried
from round to round or learned again from the window's rounds."""

from __future__ import annotations

import pytest

from gpulens.alerts.catalogue import COMMUNICATION_STALL
from gpulens.alerts.history import History
from gpulens.alerts.ncclchecks import nccl_stall_candidates
from gpulens.alerts.ncclsaves import SaveLog, ceiling_s
from gpulens.alerts.rules import builtin_rules
from gpulens.exporter.sim import SimCluster, parse_scenario
from tests.alerts import ncclscenarios

KEY = ("ckpt", "c1")


def _spell(log: SaveLog, start: float, ages: list[float], busy: list[bool | None], *, ends: bool = True) -> float:
    t = start
    for age, b in zip(ages, busy, strict=True):
        log.observe(t, {KEY: age}, {} if b is None else {KEY: b}, 3600.0)
        t += 10.0
    if ends:
        log.observe(t, {KEY: None}, {}, 3600.0)
    return t + 10.0


def test_only_a_busy_spell_that_ended_is_learned() -> None:
    log = SaveLog(hold_s=30.0)
    t = _spell(log, 0.0, [0, 10, 20, 30, 40, 50], [None, None, None, True, True, True])
    assert log.longest("ckpt") == 50.0
    t = _spell(log, t, [0, 30, 60, 90], [None, True, False, True])  # idle in one round: a dead lock, not a save
    t = _spell(log, t, [0, 30, 60, 90, 120], [None, True, True, True, True], ends=False)  # not over yet
    assert log.longest("ckpt") == 50.0
    log.observe(t, {KEY: None}, {}, 3600.0)
    assert log.longest("ckpt") == 120.0
    t = _spell(log, t + 10.0, [0, 10, 20], [None, True, True])  # shorter than ras_mismatch_for: no save at all
    assert log.longest("ckpt") == 120.0
    log.observe(t, {KEY: 5.0}, {KEY: True}, 3600.0)
    log.observe(t, {KEY: None}, {}, 3600.0)  # the same round again (two rules share the log): ignored
    assert log.longest("ckpt") == 120.0


def test_a_job_absent_for_the_window_is_forgotten() -> None:
    log = SaveLog(hold_s=30.0)
    _spell(log, 0.0, [0, 40], [True, True])
    assert log.longest("ckpt") == 40.0
    log.observe(5000.0, {("other", "c9"): None}, {}, 3600.0)
    assert log.longest("ckpt") is None


@pytest.mark.parametrize(
    ("longest", "ceiling"),
    [(None, 900.0), (30.0, 180.0), (120.0, 240.0), (600.0, 900.0)],
)
def test_the_ceiling(longest: float | None, ceiling: float) -> None:
    assert ceiling_s(longest, factor=2.0, min_s=180.0, max_s=900.0) == ceiling


def test_the_log_learned_again_from_the_window_is_the_one_carried() -> None:
    """Evaluated every round, the rule carries its log; evaluated once at the end (an engine just started), it
    learns the same saves from the window's rounds."""
    scenario = parse_scenario(ncclscenarios.checkpointing_job(every="10m", save="2m", duration="24m"), source="s")
    sim = SimCluster(scenario)
    [rule] = [r for r in builtin_rules() if r.name == COMMUNICATION_STALL]
    every, once = History(window_s=3600.0), History(window_s=3600.0)
    t = scenario.start
    while t < scenario.end:
        snapshots = [sim.snapshot(node, t) for node in ("node-00", "node-01")]
        every.add(t, snapshots)
        once.add(t, snapshots)
        nccl_stall_candidates(rule, every, t)
        t += scenario.step_s
    nccl_stall_candidates(rule, once, t - scenario.step_s)
    carried = every.memo()[("nccl_saves", 30.0)]
    learned = once.memo()[("nccl_saves", 30.0)]
    assert carried.longest(ncclscenarios.CHECKPOINT_JOB) is not None
    assert learned.longest(ncclscenarios.CHECKPOINT_JOB) == carried.longest(ncclscenarios.CHECKPOINT_JOB)
