"""The GPU sample row: what it weighs on PostgreSQL, and the writer's two PostgreSQL inserts storing the same values."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa

from gpulens.clock import ManualClock
from gpulens.model import GpuReading
from gpulens.storage import latest
from gpulens.storage.db import Database
from gpulens.storage.pgsamples import INSERT_IDEMPOTENT
from gpulens.storage.writer import Writer
from tests.fakes.static_source import h100
from tests.storage.conftest import T0, PgServer
from tests.storage.data import snapshot

_WIDTHS = {"bigint": 8, "integer": 4, "smallint": 2}
# The page bytes of a row with every field set and no XID errors (its 4-byte line pointer and its index entry apart):
# a 23-byte header with its null bitmap (xid_errors is NULL) aligned to 32, 194 bytes of values (10 bigints, 19
# integers, 19 smallints), 2 bytes of padding (revision 0012 appended six bigints after smallints), the whole aligned
# to 8: 228 -> 232. Put widest first, the values would take 226 bytes, still 232 in a page: no migration pays for it.
SAMPLE_ROW_BYTES = 232


def _in_page(size: int) -> int:
    """The bytes a tuple of ``size`` takes in a heap page: tuples start at multiples of 8."""
    return -(-size // 8) * 8


def _write(db: Database, readings: list[GpuReading], t: float) -> None:
    Writer(db).write([snapshot(readings[0].node, t, gpus=0).replace(gpus=tuple(readings))])


@contextmanager
def _statements(db: Database) -> Iterator[list[str]]:
    seen: list[str] = []

    def record(conn: object, cursor: object, statement: str, *args: object) -> None:
        seen.append(statement)

    sa.event.listen(db.engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        sa.event.remove(db.engine, "before_cursor_execute", record)


def _pg_row_sizes(db: Database) -> list[tuple[int, int, str | None]]:
    """Each stored sample's (pg_column_size, bytes of its fixed-width values, xid_errors)."""
    with db.engine.connect() as conn:
        kinds = dict(
            conn.exec_driver_sql(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_name = 'gpu_sample' AND table_schema = current_schema()"
            ).all()
        )
        widths = " + ".join(
            f"CASE WHEN {name} IS NULL THEN 0 ELSE {_WIDTHS[kind]} END"
            for name, kind in kinds.items()
            if kind in _WIDTHS
        )
        sql = f"SELECT pg_column_size(s.*), {widths}, xid_errors FROM gpu_sample AS s"
        return [(int(size), int(data), xids) for size, data, xids in conn.exec_driver_sql(sql).all()]


@pytest.fixture
def pg_db(pg_server: PgServer, clock: ManualClock) -> Iterator[Database]:
    """A PostgreSQL store at the newest revision (SQLite sizes each value by itself: no alignment to check)."""
    name = pg_server.create_database(migrated=True)
    db = Database(pg_server.url(name), clock=clock)
    yield db
    db.close()
    pg_server.drop_database(name)


def test_a_postgresql_sample_row_is_bounded_and_unpadded(pg_db: Database) -> None:
    db = pg_db
    _write(db, [h100("n", i, T0) for i in range(4)], T0)
    _write(db, [h100("n", i, T0 + 10, xid_errors={79: 1, 48: 12}) for i in range(4)], T0 + 10)
    rows = _pg_row_sizes(db)
    assert len(rows) == 8
    for size, data, xids in rows:
        if xids is None:  # a 23-byte header and a bitmap (the NULL text) aligned to 32; padding costs no page byte
            assert _in_page(size) == _in_page(32 + data) == SAMPLE_ROW_BYTES, (size, data)
        else:  # no NULL, no bitmap: a 23-byte header aligned to 24; the text's 1-byte header; at most 8 of padding
            assert _in_page(size) <= _in_page(24 + data + 1 + len(xids.encode())) + 8, (size, data, xids)


def test_both_postgresql_inserts_store_the_same_values(db: Database) -> None:
    """A round the first, unchecked insert refuses (a row in it is stored already) goes through the checked one; every
    field reads back the same from either, halves rounded alike, on either backend."""
    tricky = {
        "utilization_ratio": 0.00015,  # 1.5 ten-thousandths
        "memory_used_bytes": 75_161_927_680 + 512,  # half a KiB
        "power_watts": 612.45,
        "temperature_celsius": 61.25,
        "energy_joules_total": 12_500_000.0005,
        "pcie_tx_bytes_per_second": 1_200_000_500.0,
        "power_violation_seconds_total": 12.0005,
    }
    first = h100("n", 0, T0, **tricky)
    second = h100("n", 1, T0, **tricky)
    _write(db, [first], T0)
    with _statements(db) as seen:
        _write(db, [first, second], T0)  # the first stored already
    if db.dialect == "postgresql":
        assert any(s.startswith(INSERT_IDEMPOTENT) for s in seen)  # after the unchecked one's savepoint went back
        assert any(s.startswith("ROLLBACK TO SAVEPOINT") for s in seen)
    a, b = sorted(latest.latest_readings(db), key=lambda r: r.gpu)
    identity = {"gpu", "uuid", "pci_bus_id"}
    for f in dataclasses.fields(GpuReading):
        if f.name not in identity:
            assert getattr(a, f.name) == getattr(b, f.name), f.name
    assert a.memory_used_bytes == 75_161_927_680 + 1024  # a half rounds up, away from zero, on both


def test_a_value_out_of_range_is_stored_as_null_by_either_path(db: Database) -> None:
    _write(db, [h100("n", 0, T0, power_watts=float("nan"), sm_clock_hertz=1e16, utilization_ratio=0.5)], T0)
    [read] = latest.latest_readings(db)
    assert (read.power_watts, read.sm_clock_hertz, read.utilization_ratio) == (None, None, 0.5)
