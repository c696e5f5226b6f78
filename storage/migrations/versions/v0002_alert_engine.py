"""The alert engine's persistence: the whole state document and muting on alert_state, and notification groups.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("alert_state") as batch:
        batch.add_column(sa.Column("muted", sa.Text(), nullable=True))
        batch.add_column(sa.Column("document", _JSON, nullable=True))
    op.create_table(
        "alert_group",
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("state", _JSON, nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )


def downgrade() -> None:
    op.drop_table("alert_group")
    with op.batch_alter_table("alert_state") as batch:
        batch.drop_column("document")
        batch.drop_column("muted")
