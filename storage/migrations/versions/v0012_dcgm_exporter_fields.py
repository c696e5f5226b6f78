"""dcgm-exporter's opt-in fields and the source of throttle reasons: nineteen new sample fields, with their rollup
columns, and the SI views created again with them.

- profiling: ``sm_occupancy_ratio`` and ``fp64/fp32/fp16_active_ratio`` (1/10,000 in ``*_per10k`` smallint);
- DCGM's clock violation time counters, ``*_violation_seconds_total`` (milliseconds in ``*_violation_ms_total``
  bigint, counters: the rollups keep an increase);
- persistent ECC errors, page retirement and NVLink data CRC errors (counts, integer; ``retired_pages_pending`` a
  0/1 smallint);
- dcgm-exporter's ``health_status`` and ``p2p_peers_ok`` (smallint gauges);
- ``throttle_reasons_source``: where ``throttle_reasons`` came from, stored as the bit of its word (reported 1,
  violation 2, inferred 4); the rollups OR it, as they OR the reasons.

Existing rows keep NULL (unknown) in the new columns. Adding a column to a partitioned PostgreSQL table adds it to
every partition; on SQLite ``ALTER TABLE ... ADD COLUMN`` changes no existing row (a ``WITHOUT ROWID`` table too).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpulens.storage import views
from gpulens.storage.migrations.fields import fields_at
from gpulens.storage.schema import StoredField

revision = "0012"
down_revision: str | None = "0011"
branch_labels: str | None = None
depends_on: str | None = None

_SMALL, _INT, _BIG = sa.SmallInteger, sa.Integer, sa.BigInteger
_RATIOS = ("sm_occupancy", "fp64_active", "fp32_active", "fp16_active")
_VIOLATIONS = ("power", "thermal", "sync_boost", "board_limit", "low_utilization", "reliability")
_COUNTS = (
    "ecc_corrected_errors_persistent_total",
    "ecc_uncorrected_errors_persistent_total",
    "retired_pages_single_bit_total",
    "retired_pages_double_bit_total",
    "nvlink_crc_data_errors_total",
)
_SOURCES = ("reported", "violation", "inferred")
_ROLLUPS = ("gpu_rollup_1m", "gpu_rollup_1h")


def _new_fields() -> list[StoredField]:
    """The fields this revision adds, frozen here (name, column, kind, type and stored unit)."""
    return [
        *(StoredField(f"{n}_ratio", f"{n}_per10k", "gauge", _SMALL, 1, 10_000) for n in _RATIOS),
        *(
            StoredField(f"{n}_violation_seconds_total", f"{n}_violation_ms_total", "counter", _BIG, 1, 1000)
            for n in _VIOLATIONS
        ),
        *(StoredField(n, n, "counter", _INT, is_int=True) for n in _COUNTS),
        StoredField("retired_pages_pending", "retired_pages_pending", "gauge", _SMALL, is_bool=True),
        StoredField("health_status", "health_status", "gauge", _SMALL, is_int=True),
        StoredField("p2p_peers_ok", "p2p_peers_ok", "gauge", _SMALL, is_int=True),
        StoredField("throttle_reasons_source", "throttle_reasons_source", "bitmask", _SMALL, codes=_SOURCES),
    ]


def change_sample_fields(before: list[StoredField]) -> list[StoredField]:
    """The sample fields as 0011 left them, and this revision's (see ``fields.fields_at``)."""
    return [*before, *_new_fields()]


def _rollup_types(f: StoredField) -> dict[str, sa.types.TypeEngine[int] | sa.Double[float]]:
    types: dict[str, sa.types.TypeEngine[int] | sa.Double[float]] = {}
    for aggregate in f.aggregates:
        sql_type = sa.Double() if aggregate == "mean" else _BIG() if aggregate == "increase" else f.sql_type()
        types[f"{f.column}_{aggregate}"] = sql_type
    return types


def upgrade() -> None:
    conn = op.get_bind()
    views.drop_views(conn)
    for f in _new_fields():
        op.add_column("gpu_sample", sa.Column(f.column, f.sql_type()))
        for table in _ROLLUPS:
            for column, sql_type in _rollup_types(f).items():
                op.add_column(table, sa.Column(column, sql_type))
    views.create_views(conn, fields_at(revision), profiles=True)


def downgrade() -> None:
    conn = op.get_bind()
    views.drop_views(conn)
    for f in _new_fields():  # ALTER TABLE ... DROP COLUMN: PostgreSQL, and SQLite from 3.35
        op.execute(f"ALTER TABLE gpu_sample DROP COLUMN {f.column}")
        for table in _ROLLUPS:
            for column in _rollup_types(f):
                op.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    views.create_views(conn, fields_at("0011"), profiles=True)
