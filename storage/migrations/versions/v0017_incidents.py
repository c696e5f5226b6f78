"""``incident``: the alert engine's incidents, one row per incident with its verdict as JSON
(``gpulens.storage.incidentstore``). A store upgraded from 0016 has no incidents until the engine's next round. The
downgrade drops the table.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0017"
down_revision: str | None = "0016"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # Frozen at this revision (not imported from the schema, which moves on).
    op.create_table(
        "incident",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("fired_at", sa.Double, nullable=False),
        sa.Column("resolved_at", sa.Double),
        sa.Column("updated_at", sa.Double, nullable=False),
        sa.Column("document", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False),
    )
    op.create_index("ix_incident_state", "incident", ["state"])
    op.create_index("ix_incident_fired_at", "incident", ["fired_at"])


def downgrade() -> None:
    op.drop_index("ix_incident_fired_at", "incident")
    op.drop_index("ix_incident_state", "incident")
    op.drop_table("incident")
