"""SQLite's raw sample tables store a sample's time in 5 bytes, not 10: ``minute`` from 2020 and ``ms`` within it.

Up to 0010 each SQLite sample table (``gpu_sample``, ``nic_sample``, ``host_sample``, ``job_host_sample``) stored
``minute``, minutes since 1970 (4 bytes a row), and ``ts_ms``, milliseconds since 1970 (6 bytes), and was keyed by
``(minute, key, ts_ms)``. From this revision it stores ``minute`` counted from 2020-01-01T00:00Z (3 bytes until
2035) and ``ms``, the millisecond within that minute less half a minute (-30000 to 29999, 2 bytes), keyed by
``(minute, key, ms)``; ``ts_ms`` is a virtual generated column over the two, so reads name it as before. Every
value is kept exactly. PostgreSQL is not changed.

The upgrade copies each table into its new form in key order (the old key's order is the new one's, so the new pages
are filled), in batches of minutes (``migrations.tablecopy``), drops the old one and renames the new one. Views that
read the tables are dropped first and created again from their own SQL. The downgrade copies the rows back into the
0010 form.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op
from sqlalchemy.engine import Connection

from gpulens.storage.migrations import tablecopy

revision = "0011"
down_revision: str | None = "0010"
branch_labels: str | None = None
depends_on: str | None = None
# The tables whose rows it copies, per backend (`gpulens db upgrade --plan`, storage/upgradeplan.py).
rewrites: dict[str, tuple[str, ...]] = {"sqlite": ("gpu_sample", "nic_sample", "host_sample", "job_host_sample")}

# Frozen at this revision: the raw sample tables and their keys, and the stored time's constants.
_TABLES = {"gpu_sample": "gpu_id", "nic_sample": "nic_id", "host_sample": "host_id", "job_host_sample": "job_host_id"}
_BASE = 26_297_280  # 2020-01-01T00:00Z in minutes since 1970
_HALF = 30_000
_TS_MS = f"(minute + {_BASE}) * 60000 + ms + {_HALF}"


def _columns(conn: Connection, table: str) -> list[tuple[str, str, bool]]:
    """(name, declared type, nullable) of ``table``'s stored columns, in their order (``table_info`` lists no
    generated column)."""
    rows = conn.exec_driver_sql(f"PRAGMA table_info({table})").all()
    return [(str(row[1]), str(row[2]), not row[3]) for row in rows]


def _definitions(columns: list[tuple[str, str, bool]]) -> str:
    return ", ".join(f"{name} {kind}{'' if nullable else ' NOT NULL'}" for name, kind, nullable in columns)


def _views(conn: Connection) -> list[tuple[str, str]]:
    """Drop every view, returning (name, SQL) of each to create it again: a table a view reads cannot be renamed."""
    rows = conn.exec_driver_sql("SELECT name, sql FROM sqlite_master WHERE type = 'view'").all()
    views = [(str(name), str(sql)) for name, sql in rows]
    for name, _ in views:
        conn.exec_driver_sql(f'DROP VIEW "{name}"')
    return views


def _rebuild(conn: Connection, table: str, definitions: str, names: str, select: str, order: str) -> None:
    """Fill a new ``table`` from the old one in ``order`` (its key's, led by ``minute``) in batches of minutes, then
    put it in the old one's place."""
    new = f"{table}_0011"
    conn.exec_driver_sql(f"CREATE TABLE {new} ({definitions}) WITHOUT ROWID")
    tablecopy.copy_batched(conn, into=new, names=names, select=select, source=table, key="minute", order=order)
    conn.exec_driver_sql(f"DROP TABLE {table}")
    conn.exec_driver_sql(f"ALTER TABLE {new} RENAME TO {table}")


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "sqlite":
        return
    views = _views(conn)
    for table, key in _TABLES.items():
        rest = [c for c in _columns(conn, table) if c[0] not in ("minute", "ts_ms")]
        definitions = (
            f"minute INTEGER NOT NULL, ms SMALLINT NOT NULL, {_definitions(rest)}, "
            f"ts_ms BIGINT NOT NULL GENERATED ALWAYS AS ({_TS_MS}) VIRTUAL, PRIMARY KEY (minute, {key}, ms)"
        )
        names = ", ".join(name for name, _, _ in rest)
        select = f"minute - {_BASE}, ts_ms % 60000 - {_HALF}, {names}"
        _rebuild(conn, table, definitions, f"minute, ms, {names}", select, f"minute, {key}, ts_ms")
    for _, sql in views:
        conn.exec_driver_sql(sql)


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "sqlite":
        return
    views = _views(conn)
    for table, key in _TABLES.items():
        rest = [c for c in _columns(conn, table) if c[0] not in ("minute", "ms")]
        definitions = (
            f"minute INTEGER NOT NULL, ts_ms BIGINT NOT NULL, {_definitions(rest)}, PRIMARY KEY (minute, {key}, ts_ms)"
        )
        names = ", ".join(name for name, _, _ in rest)
        select = f"minute + {_BASE}, ts_ms, {names}"
        _rebuild(conn, table, definitions, f"minute, ts_ms, {names}", select, f"minute, {key}, ms")
    for _, sql in views:
        conn.exec_driver_sql(sql)
