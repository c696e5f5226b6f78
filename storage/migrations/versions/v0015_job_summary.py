"""``job_summary``: each ended job's accounting summary (``gpulens.storage.jobsummary``), one row per job.

The row keeps who ran it and when (``user_name``, ``start_ms``, ``end_ms``), when it was computed, and the whole
summary as JSON (``document``). Jobs that ended before the upgrade get no summary; ``gpulens job-summary`` computes
theirs on demand.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0015"
down_revision: str | None = "0014"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "job_summary",
        sa.Column("job_id", sa.Text, primary_key=True),
        sa.Column("user_name", sa.Text),
        sa.Column("start_ms", sa.BigInteger, nullable=False),
        sa.Column("end_ms", sa.BigInteger, nullable=False),
        sa.Column("computed_at", sa.Double, nullable=False),
        sa.Column("document", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False),
    )
    op.create_index("ix_job_summary_end_ms", "job_summary", ["end_ms"])


def downgrade() -> None:
    op.drop_index("ix_job_summary_end_ms", table_name="job_summary")
    op.drop_table("job_summary")
