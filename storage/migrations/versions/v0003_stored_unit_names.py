"""Stored columns named by their stored unit, rollup aggregates named ``_mean``/``_increase``, and SI views.

Renames in place, keeping the data: ``power_watts`` (which held deciwatts) becomes ``power_deciwatts``,
``memory_used_bytes`` (KiB) ``memory_used_kib``, a rollup's ``power_watts_avg`` ``power_deciwatts_mean`` and
``energy_joules_total_inc`` ``energy_millijoules_total_increase``; ``process_latest.used_memory_bytes`` becomes
``memory_used_bytes``. ``ALTER TABLE ... RENAME COLUMN`` works on SQLite (3.25 and later) without copying the table,
and on a PostgreSQL partitioned table renames the column in every partition. Then creates the views
``gpu_sample_si``, ``gpu_rollup_1m_si`` and ``gpu_rollup_1h_si`` (see storage/views.py).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpulens.storage import views
from gpulens.storage.migrations.fields import fields_at
from gpulens.storage.schema import StoredField

revision = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None

# The sample fields at this revision: (field, stored column, kind, unit, per_unit, is_bool, is_int). Frozen here, so
# that this migration renames and builds the views of its own schema whatever later revisions add.
_FIELDS = (
    ("up", "up", "gauge", 1, 1, True, False),
    ("utilization_ratio", "utilization_per10k", "gauge", 1, 10000, False, False),
    ("memory_used_bytes", "memory_used_kib", "gauge", 1024, 1, False, True),
    ("memory_total_bytes", "memory_total_kib", "gauge", 1024, 1, False, True),
    ("memory_reserved_bytes", "memory_reserved_kib", "gauge", 1024, 1, False, True),
    ("temperature_celsius", "temperature_decicelsius", "gauge", 1, 10, False, False),
    ("memory_temperature_celsius", "memory_temperature_decicelsius", "gauge", 1, 10, False, False),
    ("slowdown_temperature_celsius", "slowdown_temperature_decicelsius", "gauge", 1, 10, False, False),
    ("power_watts", "power_deciwatts", "gauge", 1, 10, False, False),
    ("power_limit_watts", "power_limit_deciwatts", "gauge", 1, 10, False, False),
    ("energy_joules_total", "energy_millijoules_total", "counter", 1, 1000, False, False),
    ("sm_clock_hertz", "sm_clock_mhz", "gauge", 1000000, 1, False, False),
    ("memory_clock_hertz", "memory_clock_mhz", "gauge", 1000000, 1, False, False),
    ("max_sm_clock_hertz", "max_sm_clock_mhz", "gauge", 1000000, 1, False, False),
    ("max_memory_clock_hertz", "max_memory_clock_mhz", "gauge", 1000000, 1, False, False),
    ("pcie_tx_bytes_per_second", "pcie_tx_kb_per_second", "gauge", 1000, 1, False, False),
    ("pcie_rx_bytes_per_second", "pcie_rx_kb_per_second", "gauge", 1000, 1, False, False),
    ("pcie_link_generation", "pcie_link_generation", "gauge", 1, 1, False, True),
    ("pcie_link_generation_max", "pcie_link_generation_max", "gauge", 1, 1, False, True),
    ("pcie_link_width", "pcie_link_width", "gauge", 1, 1, False, True),
    ("pcie_link_width_max", "pcie_link_width_max", "gauge", 1, 1, False, True),
    ("pcie_replays_total", "pcie_replays_total", "counter", 1, 1, False, True),
    ("nvlink_tx_bytes_per_second", "nvlink_tx_kb_per_second", "gauge", 1000, 1, False, False),
    ("nvlink_rx_bytes_per_second", "nvlink_rx_kb_per_second", "gauge", 1000, 1, False, False),
    ("nvlink_links_active", "nvlink_links_active", "gauge", 1, 1, False, True),
    ("nvlink_crc_flit_errors_total", "nvlink_crc_flit_errors_total", "counter", 1, 1, False, True),
    ("nvlink_replay_errors_total", "nvlink_replay_errors_total", "counter", 1, 1, False, True),
    ("nvlink_recovery_errors_total", "nvlink_recovery_errors_total", "counter", 1, 1, False, True),
    ("ecc_corrected_errors_total", "ecc_corrected_errors_total", "counter", 1, 1, False, True),
    ("ecc_uncorrected_errors_total", "ecc_uncorrected_errors_total", "counter", 1, 1, False, True),
    ("remapped_rows_correctable", "remapped_rows_correctable", "gauge", 1, 1, False, True),
    ("remapped_rows_uncorrectable", "remapped_rows_uncorrectable", "gauge", 1, 1, False, True),
    ("remapped_rows_pending", "remapped_rows_pending", "gauge", 1, 1, True, False),
    ("remapped_rows_failure", "remapped_rows_failure", "gauge", 1, 1, True, False),
    ("sm_active_ratio", "sm_active_per10k", "gauge", 1, 10000, False, False),
    ("tensor_active_ratio", "tensor_active_per10k", "gauge", 1, 10000, False, False),
    ("dram_active_ratio", "dram_active_per10k", "gauge", 1, 10000, False, False),
    ("throttle_reasons", "throttle_reasons", "bitmask", 1, 1, False, True),
    ("xid_total", "xid_total", "counter", 1, 1, False, True),
)
_ROLLUPS = ("gpu_rollup_1m", "gpu_rollup_1h")
# Old rollup aggregate suffix -> new, by field kind.
_AGGREGATES = {
    "gauge": (("min", "min"), ("avg", "mean"), ("max", "max")),
    "counter": (("inc", "increase"),),
    "bitmask": (("or", "or"),),
}


def change_sample_fields(before: list[StoredField]) -> list[StoredField]:
    """The first revision with SI views: every sample field, from ``_FIELDS`` (see ``fields.fields_at``)."""
    assert before == []
    return [
        StoredField(name, column, kind, sa.Integer, unit, per_unit, is_bool, is_int)
        for name, column, kind, unit, per_unit, is_bool, is_int in _FIELDS
    ]


def _renames() -> list[tuple[str, str, str]]:
    """(table, old column, new column) for every column this revision renames."""
    out = [("process_latest", "used_memory_bytes", "memory_used_bytes")]
    for name, column, kind, *_ in _FIELDS:
        if column != name:
            out.append(("gpu_sample", name, column))
        for old, new in _AGGREGATES[kind]:
            if (name, old) != (column, new):
                out += [(table, f"{name}_{old}", f"{column}_{new}") for table in _ROLLUPS]
    return out


def upgrade() -> None:
    for table, old, new in _renames():
        op.execute(f"ALTER TABLE {table} RENAME COLUMN {old} TO {new}")
    views.create_views(op.get_bind(), fields_at(revision))


def downgrade() -> None:
    views.drop_views(op.get_bind())
    for table, old, new in _renames():
        op.execute(f"ALTER TABLE {table} RENAME COLUMN {new} TO {old}")
