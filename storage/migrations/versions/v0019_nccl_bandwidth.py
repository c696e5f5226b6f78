"""NCCL's Inspector: ``nccl_bandwidth_round`` (``gpulens.storage.inspectorstore``).

Each round stores, per node, job, communicator, collective and message-size class, the bus bandwidth and mean
collective time the node's ranks measured, with the slowest rank and its GPU. The downgrade drops the table.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision: str | None = "0018"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # Frozen at this revision (not imported from the schema, which moves on).
    op.create_table(
        "nccl_bandwidth_round",
        sa.Column("ts_ms", sa.BigInteger, primary_key=True),
        sa.Column("node", sa.String(255), primary_key=True),
        sa.Column("job_id", sa.String(255), primary_key=True),
        sa.Column("comm", sa.String(64), primary_key=True),
        sa.Column("collective", sa.String(64), primary_key=True),
        sa.Column("size", sa.String(16), primary_key=True),
        sa.Column("bus_bytes_per_second", sa.Float, nullable=False),
        sa.Column("seconds", sa.Float, nullable=False),
        sa.Column("samples", sa.Integer, nullable=False),
        sa.Column("ranks", sa.Integer, nullable=False),
        sa.Column("slowest_rank", sa.Integer, nullable=True),
        sa.Column("slowest_gpu_uuid", sa.String(80), nullable=True),
        sa.Column("slowest_bus_bytes_per_second", sa.Float, nullable=True),
    )
    op.create_index("ix_nccl_bandwidth_round_job", "nccl_bandwidth_round", ["job_id", "ts_ms"])


def downgrade() -> None:
    op.drop_index("ix_nccl_bandwidth_round_job", table_name="nccl_bandwidth_round")
    op.drop_table("nccl_bandwidth_round")
