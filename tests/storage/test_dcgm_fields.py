"""dcgm-exporter's opt-in fields and the throttle reasons' source in storage (revision 0012), on SQLite and
PostgreSQL: each round-trips in SI units, the SI views name them, rollups keep the counters' increase and OR the
source, and a store at 0011 takes the columns without losing a row."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from gpulens.model import THROTTLE_INFERRED, THROTTLE_REPORTED, THROTTLE_VIOLATION
from gpulens.storage import latest, schema, timeseries
from gpulens.storage.db import Database
from gpulens.storage.rollup import Rollups
from gpulens.storage.writer import Writer
from tests.fakes.static_source import h100
from tests.storage.conftest import T0
from tests.storage.data import downgrade, snapshot

NEW = {
    "sm_occupancy_ratio": 0.625,
    "fp64_active_ratio": 0.0125,
    "fp32_active_ratio": 0.25,
    "fp16_active_ratio": 0.05,
    "power_violation_seconds_total": 1234.567,
    "thermal_violation_seconds_total": 0.25,
    "sync_boost_violation_seconds_total": 0.0,
    "board_limit_violation_seconds_total": 86_400.0 * 400,  # 400 days: past a 32-bit count of milliseconds
    "low_utilization_violation_seconds_total": 12.5,
    "reliability_violation_seconds_total": 3.0,
    "ecc_corrected_errors_persistent_total": 1_000_003,
    "ecc_uncorrected_errors_persistent_total": 2,
    "retired_pages_single_bit_total": 7,
    "retired_pages_double_bit_total": 1,
    "retired_pages_pending": True,
    "nvlink_crc_data_errors_total": 42,
    "health_status": 2,
    "p2p_peers_ok": 7,
    "throttle_reasons": 0x20,
    "throttle_reasons_source": THROTTLE_INFERRED,
}
ADDED_IN_0012 = set(NEW) - {"throttle_reasons"}


def test_the_new_fields_round_trip_in_si_units(db: Database) -> None:
    written = h100("node-7", 3, T0 + 0.5, **NEW)  # type: ignore[arg-type]
    Writer(db).write([snapshot("node-7", T0, gpus=0).replace(gpus=(written,))])
    [read] = latest.latest_readings(db)
    for name, value in NEW.items():
        assert getattr(read, name) == pytest.approx(value, abs=5e-4), name
        assert type(getattr(read, name)) is type(value), name
    with db.engine.connect() as conn:
        view = conn.execute(sa.text("SELECT * FROM gpu_sample_si")).mappings().one()
        stored = conn.execute(sa.text("SELECT throttle_reasons_source, power_violation_ms_total FROM gpu_sample")).one()
    assert view["throttle_reasons_source"] == THROTTLE_INFERRED
    assert view["power_violation_seconds_total"] == pytest.approx(1234.567)
    assert tuple(stored) == (4, 1_234_567)  # the word's bit; milliseconds


def test_an_unknown_source_is_stored_as_unknown(db: Database) -> None:
    written = h100("node-7", 0, T0, throttle_reasons_source="made-up")
    Writer(db).write([snapshot("node-7", T0, gpus=0).replace(gpus=(written,))])
    [read] = latest.latest_readings(db)
    assert (read.throttle_reasons, read.throttle_reasons_source) == (0x4, None)


def test_rollups_keep_the_violation_increase_and_or_the_sources(db: Database) -> None:
    writer = Writer(db)
    sources = [THROTTLE_REPORTED, THROTTLE_VIOLATION, THROTTLE_VIOLATION, None, THROTTLE_REPORTED, THROTTLE_INFERRED]
    for k, source in enumerate(sources):
        reading = h100(
            "n", 0, T0 + 10 * k, power_violation_seconds_total=100.0 + 2.5 * k, throttle_reasons_source=source
        )
        writer.write([snapshot("n", T0, gpus=0).replace(gpus=(reading,))])
    Rollups(db, settle_s=0).run(T0 + 600)
    with db.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT * FROM gpu_rollup_1m ORDER BY ts_ms")).mappings().all()
    increase = sum(r["power_violation_ms_total_increase"] or 0 for r in rows)
    assert increase == 2500 * (len(sources) - 1)  # every step's 2.5 s, in ms
    ored = 0
    for r in rows:
        ored |= r["throttle_reasons_source_or"] or 0
    assert ored == 1 | 2 | 4
    uuid = h100("n", 0, T0).uuid
    data = timeseries.series(db, [uuid], ["power_violation_seconds_total"], T0, T0 + 60, 100)[uuid]
    rates = [v for v in data.values["power_violation_seconds_total"] if v is not None]
    assert rates
    assert all(rate == pytest.approx(0.25) for rate in rates)  # 2.5 s held down per 10 s


def test_0012_downgrades_and_upgrades_keeping_every_row(db_url: str) -> None:
    """Rows written with the new fields keep their other values through 0012's downgrade (the columns go) and upgrade
    (they come back unknown); the writer then stores the new fields again."""
    db = Database(db_url)
    db.upgrade()
    Writer(db).write([snapshot("n", T0, gpus=2, power_watts=300.0, **NEW)])
    downgrade(db, "0011")
    assert _columns(db) & _ADDED_COLUMNS == set()
    assert _power_and_health(db) == [(pytest.approx(300.0), None)] * 2
    db.upgrade()
    assert _columns(db) >= _ADDED_COLUMNS
    with db.engine.connect() as conn:
        health = conn.execute(sa.text("SELECT health_status FROM gpu_sample_si")).scalars().all()
    assert health == [None, None]  # dropped with its column: unknown, not 0
    assert _power_and_health(db) == [(pytest.approx(300.0), None)] * 2
    Writer(db).write([snapshot("n", T0 + 10, gpus=2, power_watts=310.0, **NEW)])
    assert {(r.power_watts, r.throttle_reasons_source, r.health_status) for r in latest.latest_readings(db)} == {
        (310.0, THROTTLE_INFERRED, 2)
    }
    db.close()


_ADDED_COLUMNS = {schema.FIELD_BY_NAME[name].column for name in ADDED_IN_0012}


def _columns(db: Database) -> set[str]:
    with db.engine.connect() as conn:
        return {c["name"] for c in sa.inspect(conn).get_columns("gpu_sample")}


def _power_and_health(db: Database) -> list[tuple[object, ...]]:
    """Power and, where the column exists, health of the rows at T0 (through the SI view)."""
    health = "health_status" if "health_status" in _columns(db) else "NULL"
    with db.engine.connect() as conn:
        rows = conn.execute(
            sa.text(f"SELECT power_watts, {health} FROM gpu_sample_si WHERE ts_ms = :t"), {"t": round(T0 * 1000)}
        ).all()
    return sorted(tuple(row) for row in rows)
