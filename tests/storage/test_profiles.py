"""GPU profiles (revision 0008): the seldom-changing fields stored once per combination, joined back on every read.

Values round-trip through the writer, the latest readings, the SI views, series and rollups; a combination is stored
once, also across a restarted writer; a store at 0007 keeps every value through the upgrade and back; SQLite's reads
of raw samples keep their minute-leading index and look a profile up by its key.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from gpulens.model import NodeSnapshot
from gpulens.storage import latest, recent, timeseries
from gpulens.storage.db import Database
from gpulens.storage.rollup import Rollups
from gpulens.storage.writer import Writer
from tests.dbtemplate import migrated_sqlite
from tests.fakes.static_source import h100
from tests.storage.conftest import T0
from tests.storage.data import columns_added_after, downgrade, snapshot, uuid_of, write_wide

START = T0 - T0 % 60  # a minute boundary


def _profiles(db: Database) -> int:
    with db.engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM gpu_profile")).scalar_one())


def _round(t: float, first: dict[str, Any], second: dict[str, Any]) -> list[NodeSnapshot]:
    """One node of two H100s at ``t``, each reading with its own changes."""
    return [NodeSnapshot("n", t, "test", gpus=(h100("n", 0, t, **first), h100("n", 1, t, **second)))]


def _write_rounds(writer: Writer) -> None:
    """Three rounds: GPU 0's remapped rows and power limit change, then GPU 1's reserved memory turns unknown."""
    changed = {"remapped_rows_correctable": 5, "power_limit_watts": 650.0}
    writer.write(_round(START + 1, {}, {}))
    writer.write(_round(START + 11, changed, {}))
    writer.write(_round(START + 21, changed, {"memory_reserved_bytes": None}))


def test_profile_values_round_trip_and_each_combination_is_stored_once(db: Database) -> None:
    _write_rounds(Writer(db))
    assert _profiles(db) == 3  # the H100's own values, GPU 0's changed ones, GPU 1's without reserved memory
    readings = {r.gpu: r for r in latest.latest_readings(db)}
    assert (readings[0].remapped_rows_correctable, readings[0].power_limit_watts) == (5, 650.0)
    assert readings[0].memory_reserved_bytes == 2**29
    assert (readings[1].remapped_rows_correctable, readings[1].memory_reserved_bytes) == (0, None)
    assert (readings[1].pcie_link_width_max, readings[1].max_sm_clock_hertz) == (16, 1.98e9)
    with db.engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT gpu, power_limit_watts, memory_reserved_bytes FROM gpu_sample_si ORDER BY ts_ms, gpu")
        ).all()
    half = 2**29
    assert [tuple(r) for r in rows] == [
        (0, 700.0, half),
        (1, 700.0, half),
        (0, 650.0, half),
        (1, 700.0, half),
        (0, 650.0, half),
        (1, 700.0, None),
    ]
    rounds = recent.recent_rounds(db, since=START, until=START + 30, interval_s=10)
    assert [[g.power_limit_watts for s in snaps for g in s.gpus] for _, snaps in rounds] == [
        [700.0, 700.0],
        [650.0, 700.0],
        [650.0, 700.0],
    ]
    series = timeseries.series(db, [uuid_of("n", 0)], ["power_limit_watts"], START, START + 30, 100)
    assert series[uuid_of("n", 0)].values["power_limit_watts"] == (700.0, 650.0, 650.0)
    Rollups(db, settle_s=0).run(START + 120)
    with db.engine.connect() as conn:
        minute = conn.execute(
            sa.text("SELECT power_limit_watts_min, power_limit_watts_max FROM gpu_rollup_1m_si WHERE gpu = 0")
        ).one()
    assert tuple(minute) == (650.0, 700.0)
    restarted = Writer(db)  # loads the stored profiles: the same values name the same rows
    restarted.write(_round(START + 31, {"remapped_rows_correctable": 5, "power_limit_watts": 650.0}, {}))
    assert _profiles(db) == 3


def test_error_counters_growing_every_sample_add_no_profile(db: Database) -> None:
    """A faulty GPU's PCIe, NVLink and ECC counters grow every scrape: they stay in the rows, or each new value would
    be a combination of its own, kept in gpu_profile (and in the writer's memory) for good."""
    writer = Writer(db)
    for i in range(6):
        grown = {
            "pcie_replays_total": 100 * i,
            "nvlink_crc_flit_errors_total": 7 * i,
            "ecc_corrected_errors_total": 2 + i,
        }
        writer.write(_round(START + 1 + 10 * i, grown, {}))
    assert _profiles(db) == 1
    newest = {r.gpu: r for r in latest.latest_readings(db)}[0]
    assert (newest.pcie_replays_total, newest.nvlink_crc_flit_errors_total, newest.ecc_corrected_errors_total) == (
        500,
        35,
        7,
    )


@pytest.mark.empty_store
def test_0008_moves_the_profile_fields_and_keeps_every_value(db_url: str) -> None:
    """A store at 0007 with wide rows: every SI value the same after 0008 and after its downgrade; new writes land."""
    db = Database(db_url)
    db.upgrade("0007")
    write_wide(db, [snapshot("n", START + 1, gpus=2, power_watts=300.0)])
    write_wide(db, [snapshot("n", START + 11, gpus=2, remapped_rows_correctable=7, memory_reserved_bytes=None)])
    write_wide(db, [snapshot("n", START + 86_400, gpus=2, pcie_link_generation=3, remapped_rows_pending=True)])

    def si_rows() -> list[dict[str, Any]]:
        """The rows' known values: later revisions add columns, NULL in these rows (a value lost to NULL shows)."""
        with db.engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT * FROM gpu_sample_si ORDER BY ts_ms, gpu")).mappings()
            return [{k: v for k, v in r.items() if v is not None and k not in lost_below_0012} for r in rows]

    lost_below_0012 = columns_added_after("0011")  # written at head, dropped by the downgrade to 0007

    before = si_rows()
    assert len(before) == 6
    db.upgrade()
    assert si_rows() == before
    assert _profiles(db) == 3  # rounds 1 and 2 differ in the profile; round 3 again
    with db.engine.connect() as conn:
        columns = {c["name"] for c in sa.inspect(conn).get_columns("gpu_sample")}
    assert "profile_id" in columns
    assert not columns & {"memory_total_kib", "remapped_rows_correctable"}
    readings = {r.gpu: r for r in latest.latest_readings(db)}
    assert (readings[0].pcie_link_generation, readings[0].remapped_rows_pending) == (3, True)
    assert Writer(db).write([snapshot("n", START + 86_410, gpus=2, power_watts=400.0)]).gpu_rows == 2
    assert {r.power_watts for r in latest.latest_readings(db)} == {400.0}
    after = si_rows()
    downgrade(db, "0007")
    assert si_rows() == after
    with db.engine.connect() as conn:
        assert "gpu_profile" not in sa.inspect(conn).get_table_names()
    db.close()


@pytest.fixture
def sqlite_db(tmp_path: Any) -> Any:
    db = Database(migrated_sqlite(tmp_path / "plans.db"))
    yield db
    db.close()


def test_sqlite_reads_seek_the_minute_key_and_the_profile_key(sqlite_db: Database) -> None:
    """Every statement that reads gpu_sample (latest, series, rollups, recent rounds) searches it along its primary
    key from the stored minute (revision 0010), and finds each row's profile by its key: no scan."""
    db = sqlite_db
    _write_rounds(Writer(db))
    plans: list[tuple[str, list[str]]] = []

    @event.listens_for(db.engine, "before_cursor_execute")
    def explain(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        if "gpu_profile" in statement and "SELECT" in statement and not executemany:
            rows = cursor.connection.execute(f"EXPLAIN QUERY PLAN {statement}", parameters).fetchall()
            plans.append((statement, [str(row[3]) for row in rows]))

    latest.latest_readings(db, max_age_s=300)
    timeseries.series(db, [uuid_of("n", 0)], ["power_limit_watts", "remapped_rows_correctable"], START, START + 30)
    Rollups(db, settle_s=0).run(START + 120)
    recent.recent_rounds(db, since=START, until=START + 30, interval_s=10)
    event.remove(db.engine, "before_cursor_execute", explain)
    assert len(plans) >= 4
    for statement, plan in plans:
        steps = [line.split()[:2] for line in plan]
        sample_lines = [line for line, step in zip(plan, steps, strict=True) if step[1:] in (["gpu_sample"], ["s"])]
        sample_lines += [line for line in plan if line.startswith("SEARCH x ")]  # latest's subquery names it x
        profile_lines = [line for line, step in zip(plan, steps, strict=True) if step[1:] in (["gpu_profile"], ["p"])]
        assert sample_lines, (statement, plan)
        assert profile_lines, (statement, plan)
        assert all(line.startswith("SEARCH") and "PRIMARY KEY (minute=" in line for line in sample_lines), plan
        assert all("INTEGER PRIMARY KEY" in line for line in profile_lines), (statement, plan)


def test_series_of_sample_fields_only_leave_the_profiles_out(sqlite_db: Database) -> None:
    """A series of fields that live in the sample row reads no profile: the join is for profile fields only."""
    db = sqlite_db
    _write_rounds(Writer(db))
    statements: list[str] = []

    @event.listens_for(db.engine, "before_cursor_execute")
    def record(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        statements.append(statement)

    plain = timeseries.series(db, [uuid_of("n", 0)], ["utilization_ratio", "power_watts"], START, START + 30)
    profiled = timeseries.series(db, [uuid_of("n", 0)], ["power_limit_watts"], START, START + 30)
    event.remove(db.engine, "before_cursor_execute", record)
    reads = [s for s in statements if "gpu_sample" in s]
    assert len(reads) == 2
    assert "gpu_profile" not in reads[0]
    assert "gpu_profile" in reads[1]
    assert plain[uuid_of("n", 0)].values["power_watts"] == (612.5, 612.5, 612.5)
    assert profiled[uuid_of("n", 0)].values["power_limit_watts"] == (700.0, 650.0, 650.0)
