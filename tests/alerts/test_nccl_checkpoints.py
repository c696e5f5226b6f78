"""Checkpoints that look like hangs (docs/nccl-checkpoints.md): a job that saves from rank 0 alone leaves it one
collective behind in NCCL RAS for the whole save. While its own node sees its GPU copy to the host it is a writer, and
``CommunicationStall`` stays silent for a 10-minute save; a rank stopped in a dead lock (its GPU moving nothing) is
still named within 60 s; a save that outlasts ``checkpoint_max_s`` (a writer stuck in I/O) fires once past it, and
once the job has saved before, once past ``checkpoint_factor`` times its longest save."""

from __future__ import annotations

import dataclasses

from gpulens.alerts.catalogue import COMMUNICATION_STALL
from gpulens.alerts.rules import builtin_rules
from gpulens.exporter.sim import parse_scenario
from tests.alerts import ncclscenarios
from tests.alerts.expect import Outcome, run

START_S = parse_scenario(ncclscenarios.checkpointing_job(), source="start").start


def _missing(outcome: Outcome) -> list:  # type: ignore[type-arg]
    return [
        a for a in outcome.fired if a.alertname == COMMUNICATION_STALL and a.labels.get("signature") == "rank_missing"
    ]


def test_a_ten_minute_save_from_rank_0_raises_nothing() -> None:
    outcome = run(ncclscenarios.checkpointing_job(), "checkpoint-save")
    assert outcome.rounds >= (ncclscenarios.CHECKPOINT_AT_S + ncclscenarios.CHECKPOINT_S) / 10  # the save replayed
    assert not _missing(outcome), outcome.describe()
    assert not outcome.false_alerts, outcome.describe()


def test_a_ten_minute_save_in_a_16_node_job_raises_nothing() -> None:
    """In a big job another node's answer shows the writer behind before the writer's own node queries again: its
    node judges every rank of its own, so the writer is known busy all the same."""
    outcome = run(ncclscenarios.checkpointing_job(nodes=16), "checkpoint-save-16")
    assert not _missing(outcome), outcome.describe()
    assert not outcome.false_alerts, outcome.describe()


def test_with_a_ceiling_of_0_the_same_save_pages() -> None:
    """The control: the same save with a ceiling of 0 (a writer's activity holds nothing back) fires within 60 s of
    the save's start, as every such save did before this rule."""
    rules = [
        dataclasses.replace(r, thresholds={**r.thresholds, "checkpoint_max_s": 0.0})
        if r.name == COMMUNICATION_STALL
        else r
        for r in builtin_rules()
    ]
    outcome = run(ncclscenarios.checkpointing_job(), "checkpoint-no-ceiling", rules)
    [alert] = _missing(outcome)
    assert 0 <= alert.starts_at - (START_S + ncclscenarios.CHECKPOINT_AT_S) <= 60.0
    assert "rank 0 " in alert.annotations["stuck_ranks"]


def test_a_rank_in_a_dead_lock_with_no_io_is_named_within_60_s() -> None:
    outcome = run(ncclscenarios.checkpointing_job(deadlock_at="8m"), "checkpoint-deadlock")
    [alert] = _missing(outcome)
    assert 0 <= alert.starts_at - (START_S + 8 * 60) <= 60.0
    assert "node-00 GPU 0" in alert.annotations["stuck_ranks"]
    assert "rank 0 " in alert.summary


def test_a_writer_stuck_in_io_fires_once_past_the_ceiling() -> None:
    """A save that never ends looks, to the rule, like one longer than ``checkpoint_max_s``: here the ceiling is 5
    minutes and the save lasts 10, so the writer is named once the mismatch has held 5 minutes, and not before."""
    ceiling_s = 300.0
    rules = [
        dataclasses.replace(r, thresholds={**r.thresholds, "checkpoint_max_s": ceiling_s})
        if r.name == COMMUNICATION_STALL
        else r
        for r in builtin_rules()
    ]
    outcome = run(ncclscenarios.checkpointing_job(), "checkpoint-stuck-io", rules)
    [alert] = _missing(outcome)
    since_save = alert.starts_at - (START_S + ncclscenarios.CHECKPOINT_AT_S)
    assert ceiling_s <= since_save <= ceiling_s + 60.0
    assert "rank 0 " in alert.annotations["stuck_ranks"]


def test_a_writer_stuck_in_io_fires_after_twice_the_jobs_longest_save() -> None:
    """A job that saves from rank 0 for 2 minutes every 10 minutes (minutes 10, 20 and 30), then, from minute 40,
    writes a save that never ends: each 2-minute save raises nothing, and the stuck one fires once the mismatch has
    held twice the longest save learned (about 4 minutes; the floor, ``checkpoint_min_s``, is 3), not 15."""
    text = ncclscenarios.checkpointing_job(every="10m", save="2m", stuck_at="40m", duration="52m")
    outcome = run(text, "checkpoint-stuck-learned")
    [alert] = _missing(outcome)
    since_save = alert.starts_at - (START_S + 40 * 60)
    # each 2-minute save shows a mismatch held about 100 s (the first steps of a save are RAS's to see): 200 s
    assert 180.0 <= since_save <= 2 * 120.0 + 60.0, since_save
    assert "rank 0 " in alert.annotations["stuck_ranks"]
    # the control: a job that learned nothing (a factor that lifts every ceiling to checkpoint_max_s, 15 minutes)
    rules = [
        dataclasses.replace(r, thresholds={**r.thresholds, "checkpoint_factor": 100.0})
        if r.name == COMMUNICATION_STALL
        else r
        for r in builtin_rules()
    ]
    assert not _missing(run(text, "checkpoint-stuck-unlearned", rules))
