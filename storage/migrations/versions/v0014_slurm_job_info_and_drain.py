"""Slurm's job metadata (``job_info``) and the slurm-drain audit (``drain_action``): ``gpulens.storage.slurmtables``.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision: str | None = "0013"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "job_info",
        sa.Column("job_id", sa.Text, primary_key=True),
        sa.Column("node", sa.Text, nullable=False),
        sa.Column("name", sa.Text),
        sa.Column("user_name", sa.Text),
        sa.Column("account", sa.Text),
        sa.Column("partition", sa.Text),
        sa.Column("array_job_id", sa.Text),
        sa.Column("array_task_id", sa.Integer),
        sa.Column("submit_time", sa.Double),
        sa.Column("start_time", sa.Double),
        sa.Column("updated_at", sa.Double, nullable=False),
    )
    op.create_table(
        "drain_action",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("time", sa.Double, nullable=False),
        sa.Column("action", sa.Text, nullable=False),
        sa.Column("node", sa.Text, nullable=False),
        sa.Column("gpu", sa.Text, nullable=False),
        sa.Column("rule", sa.Text, nullable=False),
        sa.Column("outcome", sa.Text, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
    )
    op.create_index("ix_drain_action_time", "drain_action", ["time"])


def downgrade() -> None:
    op.drop_index("ix_drain_action_time", table_name="drain_action")
    op.drop_table("drain_action")
    op.drop_table("job_info")
