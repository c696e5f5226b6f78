"""``node_hardware``: each node's newest hardware against what it should be (``gpulens.storage.hardwarestore``).

One row per node: the agent's hardware document as JSON (GPUs on the PCI bus and those missing, the expectation, the
NVLink fabric, nvidia_peermem, each GPU's settings), its driver version and the time of the round that wrote it. A
store upgraded from 0015 has no rows until its agents send the hardware. The downgrade drops the table.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0016"
down_revision: str | None = "0015"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # Frozen at this revision (not imported from the schema, which moves on).
    op.create_table(
        "node_hardware",
        sa.Column("node", sa.String(255), primary_key=True),
        sa.Column("ts_ms", sa.BigInteger, nullable=False),
        sa.Column("driver_version", sa.String(64), nullable=True),
        sa.Column("document", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("node_hardware")
