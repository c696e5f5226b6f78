"""A restarted alert engine refills its history from the store: the stall baseline survives a collector restart."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from gpulens.alerts.config import AlertingConfig
from gpulens.alerts.rules import builtin_rules
from gpulens.alerts.service import AlertService
from gpulens.clock import ManualClock
from gpulens.model import NodeSnapshot
from gpulens.storage.db import Database
from gpulens.storage.recent import recent_rounds
from gpulens.storage.writer import Writer
from tests.alerts.support import STEP, T0, job_snapshot, stalled, training
from tests.dbtemplate import migrated_sqlite

GPUS = range(8)


def at(snapshot: NodeSnapshot, t: float) -> NodeSnapshot:
    gpus = tuple(dataclasses.replace(g, timestamp=t) for g in snapshot.gpus)
    return snapshot.replace(timestamp=t, gpus=gpus)


def service(db: Database, clock: ManualClock) -> AlertService:
    return AlertService(db, AlertingConfig(rules=tuple(builtin_rules())), clock=clock, notifiers={}, interval_s=STEP)


def stall_rounds(svc: AlertService, clock: ManualClock, count: int) -> set[str]:
    fired = set()
    for _ in range(count):
        clock.advance(STEP)
        svc.process(clock.now(), [at(job_snapshot("node-00", stalled, GPUS), clock.now())], [])
        fired |= {s.rule for s in svc.engine.states.values() if s.state == "firing"}
    return fired


def test_stored_rounds_come_back_as_rounds_with_their_jobs(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    db = Database(migrated_sqlite(tmp_path / "g.db"), clock=clock)
    writer = Writer(db)
    for i in range(12):
        writer.write([at(job_snapshot("node-00", training, GPUS), T0 + i * STEP)])
    rounds = recent_rounds(db, since=T0 + 2 * STEP, until=T0 + 11 * STEP, interval_s=STEP)
    assert [t for t, _ in rounds] == [T0 + i * STEP for i in range(2, 12)]
    [snapshot] = rounds[0][1]
    assert [g.gpu for g in snapshot.gpus] == list(GPUS)
    assert {j.job_id for j in snapshot.jobs} == {"train"}
    assert snapshot.gpus[0].utilization_ratio == 0.97
    assert snapshot.gpus[0].nvlink_tx_bytes_per_second == 50e9


def test_a_restarted_engine_keeps_the_baseline_and_catches_a_stall(tmp_path: Path) -> None:
    url = migrated_sqlite(tmp_path / "g.db")
    clock = ManualClock(T0)
    db = Database(url, clock=clock)
    first = service(db, clock)
    writer = Writer(db)
    for _ in range(30):  # five minutes of a communicating 8-GPU job, stored and judged
        snapshots = [at(job_snapshot("node-00", training, GPUS), clock.now())]
        writer.write(snapshots)
        first.process(clock.now(), snapshots, [])
        clock.advance(STEP)
    assert first.engine.history.job_reference("train")

    restarted = service(db, clock)  # the collector restarts: only the store remembers the job's baseline
    assert len(restarted.engine.history.rounds) == 30
    assert restarted.engine.history.job_reference("train")
    assert "CommunicationStall" in stall_rounds(restarted, clock, 40)

    empty = Database(migrated_sqlite(tmp_path / "empty.db"), clock=clock)
    cold = service(empty, clock)  # what a restart gave before: no history, so no baseline to call a stall against
    assert "CommunicationStall" not in stall_rounds(cold, clock, 40)
