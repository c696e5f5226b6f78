"""Rollups on SQLite and PostgreSQL: correct aggregates, incremental, resumable, late data recomputed."""

from __future__ import annotations

import sqlalchemy as sa

from storage import schema
from storage.db import Database
from storage.rollup import Rollups
from storage.writer import Writer
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
