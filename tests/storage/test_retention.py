"""Retention on SQLite (row deletes) and PostgreSQL (partition drops)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from gpulens.clock import ManualClock
from gpulens.storage import inventory, jobstats, partitions, schema, timeseries
from gpulens.storage.db import Database
from gpulens.storage.retention import DAY_S, Retention, RetentionJob, apply_retention
from gpulens.storage.rollup import Rollups
from gpulens.storage.writer import Writer
from tests.storage.conftest import T0
from tests.storage.data import snapshot, uuid_of

DAY0 = T0 - T0 % DAY_S  # midnight UTC


def _sample_days(db: Database) -> list[int]:
    s = schema.gpu_sample
    with db.session() as session:
        rows = session.execute(sa.select(s.c.ts_ms).order_by(s.c.ts_ms)).scalars()
        return sorted({int(ts // 86_400_000) for ts in rows})


def test_old_samples_go_and_series_falls_back_to_rollups(db: Database, clock: ManualClock) -> None:
    writer = Writer(db)
    for day in range(10):
        writer.write([snapshot("n", DAY0 + day * DAY_S + 60 * k, gpus=1, power_watts=300.0) for k in range(3)])
    now = DAY0 + 10 * DAY_S  # a midnight: the cutoff falls on a partition boundary
    clock.set(now)
    Rollups(db, settle_s=0).run(now)
    removed = apply_retention(db, now, Retention(raw_s=3 * DAY_S))
    assert _sample_days(db) == [int(DAY0 // DAY_S) + d for d in (7, 8, 9)]
    if db.dialect == "postgresql":
        assert removed["gpu_sample.partitions"] == 7
        with db.session() as session:
            names = sorted(partitions.existing_partitions(session.connection(), "gpu_sample"))
        assert names[0] == partitions.partition_name("gpu_sample", round((DAY0 + 7 * DAY_S) * 1000))
    else:
        assert removed["gpu_sample.rows"] == 21
    assert removed["gpu_rollup_1m.rows" if db.dialect == "sqlite" else "gpu_rollup_1m.partitions"] == 0
    # Raw data for the range is gone: the series comes from the 1-minute rollups, which still hold it.
    data = timeseries.series(db, [uuid_of("n", 0)], ["power_watts"], DAY0, DAY0 + 3600)[uuid_of("n", 0)]
    assert data.resolution == "1m"
    assert data.values["power_watts"] == pytest.approx([300.0, 300.0, 300.0])


def test_forgotten_gpus_targets_and_jobs(db: Database) -> None:
    writer = Writer(db)
    writer.write([snapshot("gone", T0, gpus=1, job="1")])
    writer.write([snapshot("gone", T0 + 60, gpus=1)])
    writer.write([snapshot("here", T0 + 800 * DAY_S, gpus=1, job="2")])
    removed = apply_retention(db, T0 + 800 * DAY_S, Retention())
    assert removed["gpu.rows"] == 1
    assert removed["job_allocation.rows"] == 1
    assert [info.node for info in inventory.gpu_info(db)] == ["here"]
    assert [j.job_id for j in jobstats.jobs(db, T0, T0 + 900 * DAY_S)] == ["2"]


def test_retention_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        Retention(raw_s=0)


def test_a_job_in_steps_removes_what_apply_retention_removes(db: Database, clock: ManualClock) -> None:
    writer = Writer(db)
    for day in range(10):
        writer.write(
            [
                snapshot(f"n{n}", DAY0 + day * DAY_S + 60 * k, gpus=2, power_watts=300.0)
                for k in range(3)
                for n in range(3)
            ]
        )
    now = DAY0 + 10 * DAY_S
    clock.set(now)
    Rollups(db, settle_s=0).run(now)
    job = RetentionJob(db, Retention(raw_s=3 * DAY_S, minute_s=5 * DAY_S), every_s=3600, slice_gpus=2)
    steps = 0
    while job.step(now):
        steps += 1
    assert _sample_days(db) == [int(DAY0 // DAY_S) + d for d in (7, 8, 9)]
    if db.dialect == "postgresql":
        assert (job.removed["gpu_sample.partitions"], job.removed["gpu_rollup_1m.partitions"]) == (7, 5)
    else:
        assert (job.removed["gpu_sample.rows"], job.removed["gpu_rollup_1m.rows"]) == (7 * 3 * 6, 5 * 3 * 6)
        assert steps >= 7 * 3  # at most one minute of samples per step
    with db.session() as session:
        horizons = dict(session.execute(sa.select(schema.tier_state.c.tier, schema.tier_state.c.horizon_ms)).all())
    assert horizons["raw"] == round((now - 3 * DAY_S) * 1000)
    assert not job.step(now + 60)  # the next pass starts an hour after this one
    assert job.step(now + 3600)  # a new pass, with more pieces to go
