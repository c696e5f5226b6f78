"""Video encoder and decoder utilization: two new sample fields (``encoder_utilization_ratio``,
``decoder_utilization_ratio``), stored like every ratio as 1/10,000 in ``*_per10k`` smallint columns, with their
rollup min/mean/max columns, and the SI views created again with them.

Existing rows keep NULL (unknown) in the new columns. Adding a column to a partitioned PostgreSQL table adds it to
every partition; on SQLite ``ALTER TABLE ... ADD COLUMN`` changes no existing row.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpulens.storage import views
from gpulens.storage.migrations.fields import fields_at
from gpulens.storage.schema import StoredField

revision = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None

# (field, stored column), frozen here: ratios stored in 1/10,000.
_NEW = (
    ("encoder_utilization_ratio", "encoder_utilization_per10k"),
    ("decoder_utilization_ratio", "decoder_utilization_per10k"),
)
_ROLLUPS = ("gpu_rollup_1m", "gpu_rollup_1h")


def change_sample_fields(before: list[StoredField]) -> list[StoredField]:
    """The fields of 0004 and the two new ones, last (see ``fields.fields_at``)."""
    new = [StoredField(name, column, "gauge", sa.SmallInteger, 1, 10_000) for name, column in _NEW]
    return [*before, *new]


def upgrade() -> None:
    conn = op.get_bind()
    views.drop_views(conn)
    for _, column in _NEW:
        op.add_column("gpu_sample", sa.Column(column, sa.SmallInteger()))
        for table in _ROLLUPS:
            op.add_column(table, sa.Column(f"{column}_min", sa.SmallInteger()))
            op.add_column(table, sa.Column(f"{column}_mean", sa.Double()))
            op.add_column(table, sa.Column(f"{column}_max", sa.SmallInteger()))
    views.create_views(conn, fields_at(revision))


def downgrade() -> None:
    conn = op.get_bind()
    views.drop_views(conn)
    for _, column in _NEW:  # ALTER TABLE ... DROP COLUMN: PostgreSQL, and SQLite from 3.35
        op.execute(f"ALTER TABLE gpu_sample DROP COLUMN {column}")
        for table in _ROLLUPS:
            for suffix in ("min", "mean", "max"):
                op.execute(f"ALTER TABLE {table} DROP COLUMN {column}_{suffix}")
    assert down_revision is not None
    views.create_views(conn, fields_at(down_revision))
