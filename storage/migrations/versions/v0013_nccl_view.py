"""NCCL's view of the jobs (NCCL RAS): ``nccl_comm_round`` and ``nccl_rank_round`` (``gpulens.storage.ncclstore``).

Each round in which a node's agent saw a communicator out of step stores one row per communicator (status, the
collective, the highest count, how long the same mismatch has held) and one per rank behind or unreachable (GPU,
pid, state, lag, count). The downgrade drops both tables.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision: str | None = "0012"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # Frozen at this revision (not imported from the schema, which moves on).
    op.create_table(
        "nccl_comm_round",
        sa.Column("ts_ms", sa.BigInteger, primary_key=True),
        sa.Column("node", sa.String(255), primary_key=True),
        sa.Column("comm", sa.String(16), primary_key=True),
        sa.Column("job_id", sa.String(255), nullable=False),
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column("status", sa.String(64), nullable=False),
        sa.Column("collective", sa.String(32), nullable=True),
        sa.Column("top_count", sa.BigInteger, nullable=True),
        sa.Column("mismatch_age_s", sa.Float, nullable=True),
    )
    op.create_index("ix_nccl_comm_round_job", "nccl_comm_round", ["job_id", "ts_ms"])
    op.create_table(
        "nccl_rank_round",
        sa.Column("ts_ms", sa.BigInteger, primary_key=True),
        sa.Column("node", sa.String(255), primary_key=True),
        sa.Column("comm", sa.String(16), primary_key=True),
        sa.Column("rank", sa.Integer, primary_key=True),
        sa.Column("job_id", sa.String(255), nullable=False),
        sa.Column("gpu", sa.Integer, nullable=True),
        sa.Column("gpu_uuid", sa.String(64), nullable=True),
        sa.Column("pid", sa.Integer, nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("lag", sa.BigInteger, nullable=True),
        sa.Column("count", sa.BigInteger, nullable=True),
    )
    op.create_index("ix_nccl_rank_round_job", "nccl_rank_round", ["job_id", "ts_ms"])


def downgrade() -> None:
    op.drop_index("ix_nccl_rank_round_job", table_name="nccl_rank_round")
    op.drop_table("nccl_rank_round")
    op.drop_index("ix_nccl_comm_round_job", table_name="nccl_comm_round")
    op.drop_table("nccl_comm_round")
