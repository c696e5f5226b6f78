"""Narrower integer types for the sample and rollup columns on PostgreSQL (SQLite sizes each value by itself).

PostgreSQL stores smallint in 2 bytes, integer in 4 and bigint in 8, whatever the value: memory in KiB, PCIe
throughput in kB/s and the error counters move from bigint to integer; clocks in MHz, PCIe link generation and
width, active NVLinks and remapped row counts from integer to smallint (see ``schema.STORED_UNITS``). Measured on
the benchmark's store, a sample row goes from 264 to 191 bytes of heap. The rollup tables' min and max columns
follow their field.

``ALTER TABLE ... ALTER COLUMN ... TYPE`` on the partitioned parent rewrites every partition once, keeping the
data and rebuilding the indexes; the SI views depend on the columns, so they are dropped first and created again
with the fields of revision 0003 (unchanged here). On SQLite the declared types change nothing on disk, and
changing them would copy every table, so this revision leaves SQLite alone (``schema`` declares the old types there).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

from gpulens.storage import views
from gpulens.storage.migrations.fields import fields_at

revision = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None
# The tables whose rows it rewrites, per backend (`gpulens db upgrade --plan`, storage/upgradeplan.py).
rewrites: dict[str, tuple[str, ...]] = {"postgresql": ("gpu_sample", "gpu_rollup_1m", "gpu_rollup_1h")}

# (stored column, field kind, type at 0003, type from 0004): frozen here.
_CHANGES = (
    ("memory_used_kib", "gauge", "bigint", "integer"),
    ("memory_total_kib", "gauge", "bigint", "integer"),
    ("memory_reserved_kib", "gauge", "bigint", "integer"),
    ("sm_clock_mhz", "gauge", "integer", "smallint"),
    ("memory_clock_mhz", "gauge", "integer", "smallint"),
    ("max_sm_clock_mhz", "gauge", "integer", "smallint"),
    ("max_memory_clock_mhz", "gauge", "integer", "smallint"),
    ("pcie_tx_kb_per_second", "gauge", "bigint", "integer"),
    ("pcie_rx_kb_per_second", "gauge", "bigint", "integer"),
    ("pcie_link_generation", "gauge", "integer", "smallint"),
    ("pcie_link_generation_max", "gauge", "integer", "smallint"),
    ("pcie_link_width", "gauge", "integer", "smallint"),
    ("pcie_link_width_max", "gauge", "integer", "smallint"),
    ("pcie_replays_total", "counter", "bigint", "integer"),
    ("nvlink_links_active", "gauge", "integer", "smallint"),
    ("nvlink_crc_flit_errors_total", "counter", "bigint", "integer"),
    ("nvlink_replay_errors_total", "counter", "bigint", "integer"),
    ("nvlink_recovery_errors_total", "counter", "bigint", "integer"),
    ("ecc_corrected_errors_total", "counter", "bigint", "integer"),
    ("ecc_uncorrected_errors_total", "counter", "bigint", "integer"),
    ("remapped_rows_correctable", "gauge", "integer", "smallint"),
    ("remapped_rows_uncorrectable", "gauge", "integer", "smallint"),
    ("xid_total", "counter", "bigint", "integer"),
)
_LIMITS = {"smallint": 32767, "integer": 2147483647}


def _alter(table: str, columns: list[tuple[str, str]]) -> None:
    """One ALTER TABLE (one rewrite) changing ``columns`` (name, type); a value that no longer fits becomes NULL."""
    clauses = []
    for column, sql_type in columns:
        limit = _LIMITS.get(sql_type)
        fits = f"CASE WHEN {column} BETWEEN {-limit} AND {limit} THEN {column} END" if limit else column
        clauses.append(f"ALTER COLUMN {column} TYPE {sql_type} USING {fits}::{sql_type}")
    op.execute(f"ALTER TABLE {table} {', '.join(clauses)}")


def _migrate(new: bool) -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    views.drop_views(conn)
    pick = 3 if new else 2
    _alter("gpu_sample", [(change[0], change[pick]) for change in _CHANGES])
    # Rollup min/max columns have their field's type; means are double precision, increases bigint.
    rollup = [(f"{c[0]}_{agg}", c[pick]) for c in _CHANGES if c[1] == "gauge" for agg in ("min", "max")]
    for table in ("gpu_rollup_1m", "gpu_rollup_1h"):
        _alter(table, rollup)
    views.create_views(conn, fields_at(revision))  # the fields of 0003: unchanged here


def upgrade() -> None:
    _migrate(new=True)


def downgrade() -> None:
    _migrate(new=False)
