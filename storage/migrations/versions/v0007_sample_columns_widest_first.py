"""gpu_sample's columns widest first on PostgreSQL: no alignment padding inside a row (SQLite is left alone).

PostgreSQL aligns each integer to its width (a bigint to 8 bytes, an integer to 4), so a narrow column followed by
a wider one leaves padding; NULL columns take no space, so where the padding falls moves with the row's values.
With the columns ordered by width (bigints, then integers, then smallints, then the text) nothing is ever padded,
as the fabric tables of revision 0006 already are. PostgreSQL cannot reorder columns in place: each day partition
is copied into a new partitioned table with the same name, bounds, unique (gpu_id, ts_ms) index and BRIN index,
and the old one dropped, partition by partition. The SI view depends on the table: it is dropped first and created
again with the same fields. The order is read from the catalogue, so every column and value is kept as it is.

SQLite sizes each value by itself and stores NULLs in no bytes wherever the column is: its table is unchanged.
The downgrade changes nothing (column order has no meaning to any query).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

from storage import views
from storage.schema import StoredField, create_partition, existing_partitions

revision = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None

_WIDTHS = {"bigint": 8, "integer": 4, "smallint": 2}  # anything else (the text) goes last


def _columns(conn: Connection, table: str) -> list[tuple[str, str, bool]]:
    """(name, SQL type, nullable) of ``table``'s columns, in their current order."""
    rows = conn.exec_driver_sql(
        "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
        "WHERE table_name = %(table)s AND table_schema = current_schema() ORDER BY ordinal_position",
        {"table": table},
    ).all()
    return [(str(name), str(kind), nullable == "YES") for name, kind, nullable in rows]


def _fields_of_0005() -> list[StoredField]:
    """The sample fields as revision 0005 left them (unchanged here): what the SI views are created with."""
    config = op.get_context().config
    assert config is not None
    script = ScriptDirectory.from_config(config).get_revision("0005")
    assert script is not None
    fields: list[StoredField] = [*script.module._fields_before(), *script.module._new_fields()]
    return fields


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    views.drop_views(conn)
    columns = _columns(conn, "gpu_sample")
    ordered = sorted(columns, key=lambda c: -_WIDTHS.get(c[1], 0))  # stable: ties keep their order
    partitions = existing_partitions(conn, "gpu_sample")
    conn.exec_driver_sql("ALTER TABLE gpu_sample RENAME TO gpu_sample_0006")
    conn.exec_driver_sql("ALTER INDEX ux_gpu_sample_gpu_ts RENAME TO ux_gpu_sample_gpu_ts_0006")
    conn.exec_driver_sql("ALTER INDEX ix_gpu_sample_ts_brin RENAME TO ix_gpu_sample_ts_brin_0006")
    definitions = ", ".join(f"{name} {kind}{'' if nullable else ' NOT NULL'}" for name, kind, nullable in ordered)
    conn.exec_driver_sql(f"CREATE TABLE gpu_sample ({definitions}) PARTITION BY RANGE (ts_ms)")
    conn.exec_driver_sql("CREATE UNIQUE INDEX ux_gpu_sample_gpu_ts ON gpu_sample (gpu_id, ts_ms)")
    conn.exec_driver_sql(
        "CREATE INDEX ix_gpu_sample_ts_brin ON gpu_sample USING brin (ts_ms) WITH (autosummarize = on)"
    )
    names = ", ".join(name for name, _, _ in ordered)
    for name, start in sorted(partitions.items(), key=lambda item: item[1]):
        old = f"{name}_0006"
        conn.exec_driver_sql(f'ALTER TABLE gpu_sample_0006 DETACH PARTITION "{name}"')
        conn.exec_driver_sql(f'ALTER TABLE "{name}" RENAME TO "{old}"')
        for (index,) in conn.exec_driver_sql(
            "SELECT indexname FROM pg_indexes WHERE tablename = %(old)s AND schemaname = current_schema()",
            {"old": old},
        ).all():  # the new partition's indexes take the same names
            conn.exec_driver_sql(f'ALTER INDEX "{index}" RENAME TO "{index}_0006"')
        create_partition(conn, "gpu_sample", start)
        conn.exec_driver_sql(f'INSERT INTO gpu_sample ({names}) SELECT {names} FROM "{old}"')  # noqa: S608
        conn.exec_driver_sql(f'DROP TABLE "{old}"')
    conn.exec_driver_sql("DROP TABLE gpu_sample_0006")
    views.create_views(conn, _fields_of_0005())


def downgrade() -> None:
    """Nothing to undo: the columns keep their order, which no query depends on."""
