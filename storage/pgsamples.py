"""PostgreSQL's insert of a round's GPU sample rows: staged by binary COPY, inserted while the writer goes on.

The row tuples (the reading's SI values, then ``gpu_id, ts_ms, profile_id, xid_total, xid_errors``) are copied into a
temporary staging table, and one ``INSERT ... SELECT`` encodes them into ``gpu_sample`` on the server. That statement
is sent in pipeline mode and its result is read only when the writer asks for it (``PendingInsert.rows``): the
writer's Python work on the round's jobs, processes and links runs meanwhile, on the other core, rather than after.
Measured on a 1 h store of 1,000 x 8 (2026-12-08): see BENCHMARKS.md.

Tried first: the unchecked insert (no range check per value, no speculative insertion). A value out of range or a
row stored already fails it, and the round's rows go in again through the checked, idempotent statement, which stores
NULL for a value that does not fit and skips what is stored (the same values either way: tests/storage).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from types import TracebackType
from typing import Any, Final

import psycopg
from sqlalchemy.engine import Connection

from gpulens.storage import schema

# The row tuple's encoded fields: every field of the row but xid_total (the last, derived from xid_errors) and the
# profile's (storage.profiles). gpu_sample's columns are named by stored unit; the staging table's by field.
ENCODED_FIELDS: Final = tuple(f for f in schema.SAMPLE_FIELDS[:-1] if not f.profile)
TAIL: Final = ("gpu_id", "ts_ms", "profile_id", "xid_total", "xid_errors")
ROW_COLUMNS: Final = (*(f.name for f in ENCODED_FIELDS), *TAIL)
SAMPLE_COLUMNS: Final = ", ".join((*(f.column for f in ENCODED_FIELDS), *TAIL))
STAGE: Final = "gpulens_sample_in"

# Why a staging table rather than COPY straight into gpu_sample: COPY cannot compute, so the stored integers would be
# encoded in Python, value by value; measured on a round of 8,000 GPUs (2026-12-07), that encoding cost as much time
# as the staging table saves, and the staged rows are also what the checked, idempotent statement reads again.
# The staging table's column types, which binary COPY sends values as. Integers are numeric so that any Python int
# arrives (one too large for its column is stored as NULL, as on SQLite).
STAGE_TYPES: Final = (
    *(f.pg_param_type for f in ENCODED_FIELDS),
    *("integer", "bigint", "integer", "bigint", "text"),
)


def _stage_ddl() -> str:
    columns = ", ".join(f"{name} {kind}" for name, kind in zip(ROW_COLUMNS, STAGE_TYPES, strict=True))
    return f"CREATE TEMP TABLE IF NOT EXISTS {STAGE} ({columns}) ON COMMIT DELETE ROWS"


def _unchecked(f: schema.StoredField) -> str:
    """The staged SI value of ``f`` as its stored integer, unchecked: PostgreSQL's assignment to the column rounds
    nothing further and refuses a value out of its range (a NaN too) with a DataError, for the whole statement."""
    if f.codes:
        return f.sql_encode(f.name, "postgresql")
    if f.is_bool:
        return f"{f.name}::integer"
    if f.unit == f.per_unit:
        return f.name
    return f"round({f.name} * {f.per_unit / f.unit!r})"  # the same round() as sql_encode's: the same stored value


def insert_sql(*, checked: bool) -> str:
    encoded = [f.sql_encode(f.name, "postgresql") if checked else _unchecked(f) for f in ENCODED_FIELDS]
    values = ", ".join([*encoded, *TAIL])
    return f"INSERT INTO gpu_sample ({SAMPLE_COLUMNS}) SELECT {values} FROM {STAGE}"  # noqa: S608


STAGE_DDL: Final = _stage_ddl()
INSERT: Final = insert_sql(checked=False)
INSERT_IDEMPOTENT: Final = insert_sql(checked=True) + " ON CONFLICT DO NOTHING"
COPY: Final = f"COPY {STAGE} ({', '.join(ROW_COLUMNS)}) FROM STDIN (FORMAT BINARY)"
_REFUSED: Final = (psycopg.IntegrityError, psycopg.DataError)  # a round written again, or a value out of range


def stage(conn: Connection, rows: Sequence[tuple[Any, ...]]) -> None:
    """Copy the row tuples into the transaction's staging table."""
    conn.exec_driver_sql(STAGE_DDL)
    with conn.connection.driver_connection.cursor() as cursor, cursor.copy(COPY) as copy:  # type: ignore[union-attr]
        copy.set_types(STAGE_TYPES)  # binary: measured 2.5 times faster than text for a round of 8,000
        for row in rows:
            copy.write_row(row)


class Inserted:
    """Rows inserted (those stored already are not counted)."""

    def __init__(self, rows: int = 0) -> None:
        self.rows = rows


class PendingInsert(Inserted):
    """The staged rows' insert, sent on entering and not waited for: the block runs while the server inserts. Leaving
    the block reads the result (``rows``: the rows inserted), going through the checked statement when the unchecked
    one was refused. Nothing else may use the connection inside the block."""

    def __init__(self, conn: Connection) -> None:
        super().__init__()
        self._conn = conn
        self._stack = ExitStack()

    def __enter__(self) -> PendingInsert:
        self._savepoint = self._conn.begin_nested()
        driver: psycopg.Connection[Any] = self._conn.connection.driver_connection  # type: ignore[assignment]
        self._cursor = driver.cursor()
        try:
            self._stack.enter_context(driver.pipeline())
            self._cursor.execute(INSERT)
        except BaseException:
            self._stack.close()
            self._cursor.close()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        try:
            self._stack.close()  # the pipeline's sync: raises the insert's error, if any
            self.rows = max(0, self._cursor.rowcount)  # before the cursor closes, which forgets it
        except _REFUSED:
            self._savepoint.rollback()
            if kind is None:
                self.rows = int(self._conn.exec_driver_sql(INSERT_IDEMPOTENT).rowcount)
            return
        except BaseException:
            if kind is None:
                raise
            return  # the block's own error goes on; the transaction is rolled back with it
        finally:
            self._cursor.close()
        self._savepoint.commit()
