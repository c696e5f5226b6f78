"""``nccl_rank_round.busy``: whether a rank's own node saw its GPU copy memory to the host while it was behind (a
checkpoint writer, ``gpulens.exporter.ncclbusy``). Rows stored before it have none. The downgrade drops the column.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision: str | None = "0019"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("nccl_rank_round") as batch:
        batch.add_column(sa.Column("busy", sa.Boolean, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nccl_rank_round") as batch:
        batch.drop_column("busy")
