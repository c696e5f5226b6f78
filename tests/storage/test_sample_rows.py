"""The GPU sample row: what it weighs on PostgreSQL, the writer's two PostgreSQL inserts storing the same values, and
revision 0021 putting a migrated store's columns widest first without changing a value."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa

from gpulens.clock import ManualClock
from gpulens.model import GpuReading
from gpulens.storage import latest, partitions
from gpulens.storage.db import Database
from gpulens.storage.writer import _PG_INSERT, _PG_INSERT_IDEMPOTENT, Writer
from tests.fakes.static_source import h100
from tests.storage.conftest import T0, PgServer
from tests.storage.data import snapshot

_WIDTHS = {"bigint": 8, "integer": 4, "smallint": 2}
# A row with every field set and no XID errors: a 24-byte header with its null bitmap (xid_errors) padded to 32, then
# 194 bytes of values (10 bigints, 19 integers, 19 smallints) and no padding between them.
SAMPLE_ROW_BYTES = 226


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
        if xids is None:  # a 23-byte header and a bitmap (the NULL text), aligned to 8; then the values, unpadded
            assert size == 32 + data, (size, data)
            assert size <= SAMPLE_ROW_BYTES
        else:  # no NULL, no bitmap: a 23-byte header aligned to 24; the short text last, unaligned, 1-byte header
            assert size == 24 + data + 1 + len(xids.encode()), (size, data, xids)


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
        assert any(s.startswith(_PG_INSERT_IDEMPOTENT) for s in seen)
        assert any(s == _PG_INSERT for s in seen)
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


def _layout(db: Database) -> tuple[list[str], list[str], list[str], list[int]]:
    """gpu_sample's partitions, their indexes, its own indexes, and the widths of its columns in order."""
    indexes = sa.text("SELECT indexname FROM pg_indexes WHERE tablename LIKE :t ORDER BY 1")
    columns = sa.text(
        "SELECT data_type FROM information_schema.columns WHERE table_name = 'gpu_sample' "
        "AND table_schema = current_schema() ORDER BY ordinal_position"
    )
    with db.engine.connect() as conn:
        return (
            sorted(partitions.existing_partitions(conn, "gpu_sample")),
            list(conn.execute(indexes, {"t": "gpu_sample_p%"}).scalars()),
            list(conn.execute(indexes, {"t": "gpu_sample"}).scalars()),
            [_WIDTHS.get(kind, 0) for kind in conn.execute(columns).scalars()],
        )


def _rows(db: Database) -> list[dict[str, object]]:
    with db.engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.text("SELECT * FROM gpu_sample ORDER BY gpu_id, ts_ms")).mappings()]


@pytest.mark.empty_store
def test_0021_orders_the_sample_columns_widest_first_and_keeps_every_row(db_url: str, clock: ManualClock) -> None:
    db = Database(db_url, clock=clock)
    db.upgrade("0020")
    _write(db, [h100("n", i, T0, xid_errors={79: 2}) for i in range(2)], T0)
    _write(db, [h100("n", i, T0 + 10, power_watts=None) for i in range(2)], T0 + 10)
    _write(db, [h100("n", i, T0 + 86_400, memory_used_bytes=5 * 2**30) for i in range(2)], T0 + 86_400)
    before = _rows(db)
    layout = _layout(db) if db.dialect == "postgresql" else None
    db.upgrade()
    assert _rows(db) == before
    assert len(before) == 6
    if layout is not None:
        parts, part_indexes, indexes, widths = _layout(db)
        assert (parts, part_indexes, indexes) == layout[:3]
        assert len(parts) >= 2
        assert widths == sorted(layout[3], reverse=True) != layout[3]
        assert widths[-1] == 0  # xid_errors, the text, last
    assert Writer(db).write([snapshot("n", T0 + 86_400, gpus=2)]).gpu_rows == 0  # stored already: skipped
    assert Writer(db).write([snapshot("n", T0 + 86_410, gpus=2, power_watts=400.0)]).gpu_rows == 2
    assert {r.power_watts for r in latest.latest_readings(db)} == {400.0}
    db.close()
