"""The GPU sample table's columns widest first again on PostgreSQL: the padding revision 0012 brought back is gone.

Revision 0007 ordered ``gpu_sample``'s columns by width (8-byte types, integers, smallints, then the text) so that no
value is padded to its alignment. Revision 0012 appended its fields at the end (six bigint counters after the
smallints, then integers and smallints again), and ``xid_errors``, the text, was left in the middle: a row with every
field took 196 bytes of data where 194 hold its values, and one with XID errors up to 8 more. A migrated store then
also kept a column order that a new store (``storage.schema``, widest first) does not have.

As in revision 0007, PostgreSQL cannot reorder columns in place: the parent is renamed and created again with the same
columns, types and indexes, widest first, then its day partitions are moved one at a time, each its own batch
(detached, renamed with its indexes, copied into a new partition of the same name and bounds in its stored order,
dropped). The SI views depend on the table: they are dropped first and created again with the same fields. Values
are copied as they are. SQLite sizes each value by itself and has no alignment: it is unchanged. The downgrade
changes nothing (no query depends on column order).

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07
"""

from __future__ import annotations

from alembic import op
from sqlalchemy.engine import Connection

from gpulens.storage import views
from gpulens.storage.migrations.fields import fields_at
from gpulens.storage.partitions import create_partition, existing_partitions

revision = "0021"
down_revision: str | None = "0020"
branch_labels: str | None = None
depends_on: str | None = None
# The tables whose rows it copies, per backend (`gpulens db upgrade --plan`, storage/upgradeplan.py).
rewrites: dict[str, tuple[str, ...]] = {"postgresql": ("gpu_sample",)}

_WIDTHS = {"bigint": 8, "double precision": 8, "integer": 4, "smallint": 2}  # anything else (the text) goes last
_OLD = "gpu_sample_0020"
# The parent's indexes as of revision 0020 (its partitions get theirs from these).
_INDEXES = (
    "CREATE UNIQUE INDEX ux_gpu_sample_gpu_ts ON gpu_sample (gpu_id, ts_ms)",
    "CREATE INDEX ix_gpu_sample_ts_brin ON gpu_sample USING brin (ts_ms) WITH (autosummarize = on)",
)


def _columns(conn: Connection) -> list[tuple[str, str, bool]]:
    """(name, SQL type, nullable) of gpu_sample's columns, in their current order."""
    rows = conn.exec_driver_sql(
        "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
        "WHERE table_name = 'gpu_sample' AND table_schema = current_schema() ORDER BY ordinal_position"
    ).all()
    return [(str(name), str(kind), nullable == "YES") for name, kind, nullable in rows]


def _rename_indexes(conn: Connection, table: str) -> None:
    """Give ``table``'s indexes the suffix ``_0020``: the new table's take their names."""
    for (index,) in conn.exec_driver_sql(
        "SELECT indexname FROM pg_indexes WHERE tablename = %(table)s AND schemaname = current_schema()",
        {"table": table},
    ).all():
        conn.exec_driver_sql(f'ALTER INDEX "{index}" RENAME TO "{index}_0020"')


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    views.drop_views(conn)
    ordered = sorted(_columns(conn), key=lambda c: -_WIDTHS.get(c[1], 0))  # stable: ties keep their order
    partitions = existing_partitions(conn, "gpu_sample")
    conn.exec_driver_sql(f"ALTER TABLE gpu_sample RENAME TO {_OLD}")
    _rename_indexes(conn, _OLD)
    definitions = ", ".join(f"{name} {kind}{'' if nullable else ' NOT NULL'}" for name, kind, nullable in ordered)
    conn.exec_driver_sql(f"CREATE TABLE gpu_sample ({definitions}) PARTITION BY RANGE (ts_ms)")
    for index in _INDEXES:
        conn.exec_driver_sql(index)
    names = ", ".join(name for name, _, _ in ordered)
    for name, start in sorted(partitions.items(), key=lambda item: item[1]):
        old = f"{name}_0020"
        conn.exec_driver_sql(f'ALTER TABLE {_OLD} DETACH PARTITION "{name}"')
        conn.exec_driver_sql(f'ALTER TABLE "{name}" RENAME TO "{old}"')
        _rename_indexes(conn, old)
        create_partition(conn, "gpu_sample", start)
        conn.exec_driver_sql(f'INSERT INTO gpu_sample ({names}) SELECT {names} FROM "{old}"')  # noqa: S608
        conn.exec_driver_sql(f'DROP TABLE "{old}"')
    conn.exec_driver_sql(f"DROP TABLE {_OLD}")
    views.create_views(conn, fields_at(revision), profiles=True)  # the fields of 0020: unchanged here


def downgrade() -> None:
    """Nothing to undo: the columns keep their order, which no query depends on."""
