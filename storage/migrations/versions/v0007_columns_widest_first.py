"""The GPU sample and rollup tables' columns widest first on PostgreSQL: no alignment padding inside a row.

PostgreSQL aligns each value to its type (a bigint or a double precision to 8 bytes, an integer to 4), so a narrow
column followed by a wider one leaves padding; NULL columns take no space, so where the padding falls moves with the
row's values. With the columns ordered by width (8-byte types, integers, smallints, then the text) nothing is ever
padded, as the fabric tables of revision 0006 already are. Measured on the benchmark's store, a sample row with its
indexes goes from 246 to 228 bytes; a rollup row's data from 656 to 528 bytes (its smallint min and max columns sat
between double precision means).

PostgreSQL cannot reorder columns in place: each table is renamed and created again in the new order, with the same
columns, types, primary key and indexes, then its partitions are moved one at a time (detached, renamed with their
indexes, copied into a new partition of the same name and bounds, dropped). The SI views depend on the tables: they
are dropped first and created again with the same fields. The order is read from the catalogue, so every column and
value is kept as it is.

SQLite sizes each value by itself, has no alignment, and stores NULLs in no bytes wherever the column is: its tables
are unchanged. The downgrade changes nothing (column order has no meaning to any query).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op
from sqlalchemy.engine import Connection

from gpulens.storage import views
from gpulens.storage.migrations.fields import fields_at
from gpulens.storage.partitions import create_partition, existing_partitions

revision = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None
# The tables whose rows it copies, per backend (`gpulens db upgrade --plan`, storage/upgradeplan.py).
rewrites: dict[str, tuple[str, ...]] = {"postgresql": ("gpu_sample", "gpu_rollup_1m", "gpu_rollup_1h")}

_WIDTHS = {"bigint": 8, "double precision": 8, "integer": 4, "smallint": 2}  # anything else (the text) goes last
# Each table, with the constraint and indexes of its parent (frozen at 0006).
_TABLES = {
    "gpu_sample": (
        "",
        (
            "CREATE UNIQUE INDEX ux_gpu_sample_gpu_ts ON gpu_sample (gpu_id, ts_ms)",
            "CREATE INDEX ix_gpu_sample_ts_brin ON gpu_sample USING brin (ts_ms) WITH (autosummarize = on)",
        ),
    ),
    "gpu_rollup_1m": (", PRIMARY KEY (gpu_id, ts_ms)", ()),
    "gpu_rollup_1h": (", PRIMARY KEY (gpu_id, ts_ms)", ()),
}


def _columns(conn: Connection, table: str) -> list[tuple[str, str, bool]]:
    """(name, SQL type, nullable) of ``table``'s columns, in their current order."""
    rows = conn.exec_driver_sql(
        "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
        "WHERE table_name = %(table)s AND table_schema = current_schema() ORDER BY ordinal_position",
        {"table": table},
    ).all()
    return [(str(name), str(kind), nullable == "YES") for name, kind, nullable in rows]


def _rename_indexes(conn: Connection, table: str) -> None:
    """Give ``table``'s indexes (and so its primary key) the suffix ``_0006``: the new table's take their names."""
    for (index,) in conn.exec_driver_sql(
        "SELECT indexname FROM pg_indexes WHERE tablename = %(table)s AND schemaname = current_schema()",
        {"table": table},
    ).all():
        conn.exec_driver_sql(f'ALTER INDEX "{index}" RENAME TO "{index}_0006"')


def _reorder(conn: Connection, table: str) -> None:
    key, indexes = _TABLES[table]
    columns = _columns(conn, table)
    ordered = sorted(columns, key=lambda c: -_WIDTHS.get(c[1], 0))  # stable: ties keep their order
    partitions = existing_partitions(conn, table)
    old_parent = f"{table}_0006"
    conn.exec_driver_sql(f"ALTER TABLE {table} RENAME TO {old_parent}")
    _rename_indexes(conn, old_parent)
    definitions = ", ".join(f"{name} {kind}{'' if nullable else ' NOT NULL'}" for name, kind, nullable in ordered)
    conn.exec_driver_sql(f"CREATE TABLE {table} ({definitions}{key}) PARTITION BY RANGE (ts_ms)")
    for index in indexes:
        conn.exec_driver_sql(index)
    names = ", ".join(name for name, _, _ in ordered)
    for name, start in sorted(partitions.items(), key=lambda item: item[1]):
        old = f"{name}_0006"
        conn.exec_driver_sql(f'ALTER TABLE {old_parent} DETACH PARTITION "{name}"')
        conn.exec_driver_sql(f'ALTER TABLE "{name}" RENAME TO "{old}"')
        _rename_indexes(conn, old)
        create_partition(conn, table, start)
        conn.exec_driver_sql(f'INSERT INTO {table} ({names}) SELECT {names} FROM "{old}"')  # noqa: S608
        conn.exec_driver_sql(f'DROP TABLE "{old}"')
    conn.exec_driver_sql(f"DROP TABLE {old_parent}")


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    views.drop_views(conn)
    for table in _TABLES:
        _reorder(conn, table)
    views.create_views(conn, fields_at(revision))  # the fields of 0005: unchanged here


def downgrade() -> None:
    """Nothing to undo: the columns keep their order, which no query depends on."""
