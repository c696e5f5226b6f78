"""The GPU sample and rollup tables' columns widest first on PostgreSQL: no alignment padding inside a row.

PostgreSQL aligns each value to its type (a bigint or a double precision to 8 bytes, an integer to 4), so a narrow
column followed by a wider one leaves padding; NULL columns take no space, so where the padding falls moves with the
row's values. With the columns ordered by width (8-byte types, integers, smallints, then the text) nothing is ever
padded, as the fabric tables of revision 0006 already are. Measured on the benchmark's store, a sample row with its
indexes goes from 246 to 228 bytes; a rollup row's data from 656 to 528 bytes (its smallint min and max columns sat
between double precision means).

PostgreSQL cannot reorder columns in place: each table is created again beside the live one in the new order, with
the same columns, types, primary key, indexes and partitions, filled from it in batches while it is only read, then
swapped in (``migrations.tablecopy``). The SI views depend on the tables: they are dropped just before the swap and
created again with the same fields. The order is read from the catalogue, so every column and
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
from gpulens.storage.migrations import tablecopy
from gpulens.storage.migrations.fields import fields_at

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


def _fill(conn: Connection, table: str) -> None:
    key, indexes = _TABLES[table]
    ordered = sorted(_columns(conn, table), key=lambda c: -_WIDTHS.get(c[1], 0))  # stable: ties keep their order
    definitions = ", ".join(f"{name} {kind}{'' if nullable else ' NOT NULL'}" for name, kind, nullable in ordered)
    names = ", ".join(name for name, _, _ in ordered)
    tablecopy.fill_partitioned(
        conn, table, definitions=f"{definitions}{key}", indexes=indexes, names=names, select=names
    )


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    for table in _TABLES:  # the live tables are only read until the swap
        _fill(conn, table)
    views.drop_views(conn)
    for table in _TABLES:
        tablecopy.swap_partitioned(conn, table)
    views.create_views(conn, fields_at(revision))  # the fields of 0005: unchanged here


def downgrade() -> None:
    """Nothing to undo: the columns keep their order, which no query depends on."""
