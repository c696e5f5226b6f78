"""Rollups on SQLite and PostgreSQL: correct aggregates, incremental, resumable, late data recomputed."""

from __future__ import annotations

import sqlalchemy as sa

from gpulens.storage import schema
from gpulens.storage.db import Database
from gpulens.storage.rollup import Rollups
from gpulens.storage.writer import Writer
from tests.storage.conftest import T0
from tests.storage.data import snapshot

START = T0 - T0 % 3600  # an hour boundary


def _rows(db: Database, table: sa.Table, *columns: str) -> list[tuple[object, ...]]:
    with db.session() as session:
        selected = [table.c[c] for c in ("gpu_id", "ts_ms", *columns)]
        return [tuple(row) for row in session.execute(sa.select(*selected).order_by(*selected[:2]))]


def _write_minutes(db: Database, writer: Writer, first: int, last: int) -> None:
    """Samples every 10 s for minutes [first, last): power 100 + second of the minute, energy +10 J a second."""
    writer.write(
        [
            snapshot("n", START + s, gpus=1, power_watts=100.0 + s % 60, energy_joules_total=10.0 * s)
            for s in range(first * 60, last * 60, 10)
        ]
    )


def test_minute_aggregates(db: Database) -> None:
    writer = Writer(db)
    _write_minutes(db, writer, 0, 3)
    written = Rollups(db, settle_s=0).run(START + 180)
    assert written == 3
    rows = _rows(db, schema.gpu_rollup_1m, "n", "power_deciwatts_min", "power_deciwatts_mean", "power_deciwatts_max")
    assert [r[1:] for r in rows] == [
        (round((START + 60 * m) * 1000), 6, 1000, 1250.0, 1500)
        for m in range(3)  # deciwatts
    ]
    increases = _rows(db, schema.gpu_rollup_1m, "energy_millijoules_total_increase", "elapsed_ms")
    # Minute 0's first sample has no predecessor: 5 increases of 100 J; later minutes count from the previous one.
    assert [r[2:] for r in increases] == [(500_000, 50_000), (600_000, 60_000), (600_000, 60_000)]


def test_incremental_and_resumable(db: Database) -> None:
    writer = Writer(db)
    _write_minutes(db, writer, 0, 3)
    assert Rollups(db, settle_s=0).run(START + 180) == 3
    assert Rollups(db, settle_s=0).run(START + 180) == 0  # nothing new
    _write_minutes(db, writer, 3, 5)
    restarted = Rollups(db, settle_s=0)  # a new process: the position comes from the database
    assert restarted.run(START + 300) == 2
    assert len(_rows(db, schema.gpu_rollup_1m)) == 5


def test_settle_waits_for_the_minute_to_fill(db: Database) -> None:
    _write_minutes(db, Writer(db), 0, 2)
    assert Rollups(db, settle_s=30).run(START + 120 + 29) == 1
    assert Rollups(db, settle_s=30).run(START + 120 + 30) == 1


def test_late_samples_are_rolled_up_again(db: Database) -> None:
    writer = Writer(db)
    _write_minutes(db, writer, 0, 3)
    rollups = Rollups(db, settle_s=0)
    rollups.run(START + 180)
    late = snapshot("n", START + 65, gpus=1, power_watts=500.0, energy_joules_total=650.0)
    writer.write([late])  # minute 1 gets a seventh sample after it was rolled up
    assert rollups.run(START + 180) >= 1
    rows = _rows(db, schema.gpu_rollup_1m, "n", "power_deciwatts_max")
    assert rows[1][2:] == (7, 5000)
    assert rows[0][2:] == (6, 1500)


def test_hours_from_minutes(db: Database) -> None:
    writer = Writer(db)
    _write_minutes(db, writer, 0, 130)
    rollups = Rollups(db, settle_s=0)
    rollups.run(START + 130 * 60)
    hours = _rows(db, schema.gpu_rollup_1h, "n", "power_deciwatts_min", "power_deciwatts_mean", "power_deciwatts_max")
    assert [h[1:] for h in hours] == [
        (round(START * 1000), 360, 1000, 1250.0, 1500),
        (round((START + 3600) * 1000), 360, 1000, 1250.0, 1500),
    ]
    energy = _rows(db, schema.gpu_rollup_1h, "energy_millijoules_total_increase", "elapsed_ms")
    assert energy[1][2:] == (36_000_000, 3_600_000)  # 10 J/s for an hour, in mJ
    # A late sample in hour 0 is recomputed in both tiers.
    writer.write([snapshot("n", START + 1805, gpus=1, power_watts=900.0, energy_joules_total=18_050.0)])
    rollups.run(START + 130 * 60)
    hours = _rows(db, schema.gpu_rollup_1h, "n", "power_deciwatts_max")
    assert hours[0][2:] == (361, 9000)


def _write_cluster_minutes(writer: Writer, first: int, last: int, nodes: int = 3) -> None:
    writer.write(
        [
            snapshot(f"n{n}", START + s, gpus=2, power_watts=100.0 + n + s % 60, energy_joules_total=10.0 * s)
            for s in range(first * 60, last * 60, 10)
            for n in range(nodes)
        ]
    )


def _all_rollups(db: Database) -> list[tuple[object, ...]]:
    columns = ("n", "elapsed_ms", "power_deciwatts_mean", "power_deciwatts_max", "energy_millijoules_total_increase")
    return _rows(db, schema.gpu_rollup_1m, *columns) + _rows(db, schema.gpu_rollup_1h, *columns)


def test_steps_give_what_run_gives(db: Database) -> None:
    writer = Writer(db)
    _write_cluster_minutes(writer, 0, 62)
    rollups = Rollups(db, settle_s=0, slice_gpus=2)  # 6 GPUs: three slices a bucket
    steps = 0
    while rollups.step(START + 62 * 60):
        steps += 1
    assert steps >= 62 + 1  # at most one bucket per step (its slices grow as steps measure fast)
    assert not rollups.step(START + 62 * 60)  # nothing pending
    stepped = _all_rollups(db)
    assert len(stepped) == 6 * 62 + 6  # 62 minutes and one hour of 6 GPUs
    with db.write_transaction() as conn:
        conn.execute(sa.delete(schema.gpu_rollup_1m))
        conn.execute(sa.delete(schema.gpu_rollup_1h))
        conn.execute(sa.update(schema.tier_state).values(position_ms=None))
    assert Rollups(db, settle_s=0).run(START + 62 * 60) == len(stepped)
    assert _all_rollups(db) == stepped


def test_samples_landing_in_a_bucket_being_stepped_are_rolled_up(db: Database) -> None:
    writer = Writer(db)
    _write_cluster_minutes(writer, 0, 2)
    rollups = Rollups(db, settle_s=0, slice_gpus=2)
    assert rollups.step(START + 120)  # minute 0, first slice (GPUs 1): the bucket is pending
    with db.session() as session:
        t = schema.tier_state
        pending = session.execute(sa.select(t.c.position_ms).where(t.c.tier == "1m.pending")).scalar_one()
        position = session.execute(sa.select(t.c.position_ms).where(t.c.tier == "1m")).scalar_one()
    assert (position, pending) == (None, round((START + 60) * 1000))  # readers still see the old position
    # A late sample of a GPU already rolled up, in the pending minute: the writer marks it.
    writer.write([snapshot("n0", START + 35, gpus=2, power_watts=900.0, energy_joules_total=350.0)])
    while rollups.step(START + 120):
        pass
    rows = _rows(db, schema.gpu_rollup_1m, "n", "power_deciwatts_max")
    assert rows[0][2:] == (7, 9000)  # n0 GPU 0, minute 0: recomputed with the late sample
    assert len(rows) == 12
    with db.session() as session:
        tiers = session.execute(sa.select(schema.tier_state.c.tier)).scalars()
        assert "1m.pending" not in set(tiers)


def test_run_finishes_a_stepped_bucket(db: Database) -> None:
    writer = Writer(db)
    _write_cluster_minutes(writer, 0, 2)
    rollups = Rollups(db, settle_s=0, slice_gpus=2)
    assert rollups.step(START + 120)
    assert rollups.run(START + 120) == 12 - 2  # the rest of minute 0, then minute 1
    assert len(_rows(db, schema.gpu_rollup_1m)) == 12
