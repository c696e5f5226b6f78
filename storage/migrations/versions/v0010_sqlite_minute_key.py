"""SQLite's raw sample tables are clustered by minute: ``WITHOUT ROWID``, primary key ``(minute, key, ts_ms)``.

Up to 0009 each SQLite sample table (``gpu_sample``, ``nic_sample``, ``host_sample``, ``job_host_sample``) was a
rowid heap with a unique expression index on ``(ts_ms / 60000, key, ts_ms)``: every row's key was kept twice, once
in the heap with its rowid and once in the index. From this revision the table is that index: a new column
``minute`` holds ``ts_ms / 60000`` (SQLite allows no expression in a primary key) and leads the primary key, and
the expression index is gone. Reads and deletes name ``minute`` where they named ``ts_ms / 60000``. PostgreSQL is
not changed.

The upgrade copies each table into its new form in key order (along the old index, so nothing is sorted and the new
pages are filled), in batches of minutes (``migrations.tablecopy``), drops the old one and renames the new one.
Views that read the tables are dropped first and created again from their own SQL. The downgrade copies the rows
back into a heap and creates the index again.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op
from sqlalchemy.engine import Connection

from gpulens.storage.migrations import tablecopy

revision = "0010"
down_revision: str | None = "0009"
branch_labels: str | None = None
depends_on: str | None = None
# The tables whose rows it copies, per backend (`gpulens db upgrade --plan`, storage/upgradeplan.py).
rewrites: dict[str, tuple[str, ...]] = {"sqlite": ("gpu_sample", "nic_sample", "host_sample", "job_host_sample")}

# The raw sample tables and their keys, frozen at this revision; the index each had before it.
_TABLES = {"gpu_sample": "gpu_id", "nic_sample": "nic_id", "host_sample": "host_id", "job_host_sample": "job_host_id"}
_OLD_INDEX = {
    "gpu_sample": "ux_gpu_sample_minute_gpu_ts",
    **{t: f"ux_{t}_minute_key_ts" for t in ("nic_sample", "host_sample", "job_host_sample")},
}


def _columns(conn: Connection, table: str) -> list[tuple[str, str, bool]]:
    """(name, declared type, nullable) of ``table``'s columns, in their order."""
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


def _rebuild(
    conn: Connection, table: str, definitions: str, select: str, order: str, minute: str, options: str = ""
) -> None:
    """Fill a new ``table`` (created from ``definitions`` and ``options``) from the old one in ``order``, in batches
    of minutes (``minute``: the old table's minute, the head of ``order``), then put it in the old one's place (its
    index goes with it)."""
    new = f"{table}_0010"
    conn.exec_driver_sql(f"CREATE TABLE {new} ({definitions}){options}")
    names = ", ".join(name for name, _, _ in _columns(conn, new))
    tablecopy.copy_batched(conn, into=new, names=names, select=select, source=table, key=minute, order=order)
    conn.exec_driver_sql(f"DROP TABLE {table}")
    conn.exec_driver_sql(f"ALTER TABLE {new} RENAME TO {table}")


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "sqlite":
        return
    views = _views(conn)
    for table, key in _TABLES.items():
        columns = [c for c in _columns(conn, table) if c[0] != "minute"]
        definitions = f"minute INTEGER NOT NULL, {_definitions(columns)}, PRIMARY KEY (minute, {key}, ts_ms)"
        names = ", ".join(name for name, _, _ in columns)
        # In the old index's order: read along it, and appended to the new table's key (its pages filled).
        order = f"ts_ms / 60000, {key}, ts_ms"
        _rebuild(conn, table, definitions, f"ts_ms / 60000, {names}", order, "ts_ms / 60000", " WITHOUT ROWID")
    for _, sql in views:
        conn.exec_driver_sql(sql)


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "sqlite":
        return
    views = _views(conn)
    for table, key in _TABLES.items():
        columns = [c for c in _columns(conn, table) if c[0] != "minute"]
        names = ", ".join(name for name, _, _ in columns)
        _rebuild(conn, table, _definitions(columns), names, f"minute, {key}, ts_ms", "minute")
        conn.exec_driver_sql(f"CREATE UNIQUE INDEX {_OLD_INDEX[table]} ON {table} (ts_ms / 60000, {key}, ts_ms)")
    for _, sql in views:
        conn.exec_driver_sql(sql)
