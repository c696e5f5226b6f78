"""Remediation's memory in the store (``gpulens.storage.remediationstore``): the nodes it drained
(``remediation_node``), the incidents or alerts holding each (``remediation_cause``), the brake's halts
(``remediation_halt``), and two columns of the audit ``drain_action``: ``step`` (drain, resume, requeue, command) and
``causes``. Rows audited before keep NULL in both. The downgrade drops them.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision: str | None = "0017"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # Frozen at this revision (not imported from the schema, which moves on).
    op.add_column("drain_action", sa.Column("step", sa.Text, nullable=True))
    op.add_column("drain_action", sa.Column("causes", sa.Text, nullable=True))
    op.create_table(
        "remediation_node",
        sa.Column("node", sa.String(255), primary_key=True),
        sa.Column("action", sa.Text, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("drained_at", sa.Double, nullable=False),
        sa.Column("held", sa.Boolean, nullable=False),
        sa.Column("dry_run", sa.Boolean, nullable=False),
    )
    op.create_table(
        "remediation_cause",
        sa.Column("node", sa.String(255), primary_key=True),
        sa.Column("cause", sa.String(255), primary_key=True),
        sa.Column("action", sa.Text, nullable=False),
        sa.Column("opened_at", sa.Double, nullable=False),
        sa.Column("summary", sa.Text, nullable=False),
    )
    op.create_table(
        "remediation_halt",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("halted_at", sa.Double, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("lifted_at", sa.Double, nullable=True),
        sa.Column("lifted_by", sa.Text, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("remediation_halt")
    op.drop_table("remediation_cause")
    op.drop_table("remediation_node")
    op.drop_column("drain_action", "causes")
    op.drop_column("drain_action", "step")
