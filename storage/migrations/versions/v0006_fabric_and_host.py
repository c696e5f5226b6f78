"""The fabric and the host: RDMA port rows, node CPU and memory rows, each job's cgroup rows, with their rollups.

Three dimension tables (``nic``, ``host``, ``job_host``) give each port, node and job-on-a-node a compact integer id;
each has a raw sample table and 1-minute and 1-hour rollup tables shaped like the GPU ones (``storage.fabricschema``
describes them): samples keyed ``(<key>, ts_ms)`` with SQLite's minute-leading unique index and PostgreSQL's day
partitions, their columns widest first (no alignment padding); rollups with ``n``, ``elapsed_ms`` and
``<column>_min/_mean/_max`` (gauges) or ``_increase`` (counters). Each table gets an SI view, ``<table>_si``
(``nic_sample_si``: the port's node, device, port, link layer and GPUs joined, states by name). The column lists are
frozen here. Existing tables are untouched.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpulens.storage import views
from gpulens.storage.schema import StoredField

revision = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None

_TYPES = {"smallint": sa.SmallInteger, "integer": sa.Integer, "bigint": sa.BigInteger}
_WIDTHS = {"smallint": 2, "integer": 4, "bigint": 8}
# (family, key, [(column, kind, type)], raw-only smallint columns): frozen at 0006.
_FAMILIES: list[tuple[str, str, list[tuple[str, str, str]], list[str]]] = [
    (
        "nic",
        "nic_id",
        [
            ("up", "gauge", "smallint"),
            ("rate_kb_per_second", "gauge", "integer"),
            ("link_width", "gauge", "smallint"),
            ("transmit_kb_per_second", "gauge", "integer"),
            ("receive_kb_per_second", "gauge", "integer"),
            ("transmit_wait_per_second", "gauge", "bigint"),
            ("cnp_handled_deci_per_second", "gauge", "integer"),
            ("transmit_bytes_total", "counter", "bigint"),
            ("receive_bytes_total", "counter", "bigint"),
            ("link_downed_total", "counter", "integer"),
            ("symbol_errors_total", "counter", "integer"),
            ("receive_errors_total", "counter", "integer"),
            ("local_link_integrity_errors_total", "counter", "integer"),
            ("link_error_recovery_total", "counter", "integer"),
            ("transmit_discards_total", "counter", "bigint"),
            ("cnp_handled_total", "counter", "bigint"),
        ],
        ["state_code", "phys_state_code", "link_speed_code"],
    ),
    (
        "host",
        "host_id",
        [
            ("cpu_busy_per10k", "gauge", "smallint"),
            ("cpu_iowait_per10k", "gauge", "smallint"),
            ("memory_used_mib", "gauge", "integer"),
            ("memory_available_mib", "gauge", "integer"),
            ("memory_total_mib", "gauge", "integer"),
        ],
        [],
    ),
    (
        "job_host",
        "job_host_id",
        [
            ("cpu_milliseconds_total", "counter", "bigint"),
            ("cpu_used_centicores", "gauge", "integer"),
            ("cpu_limit_centicores", "gauge", "integer"),
            ("memory_used_mib", "gauge", "integer"),
            ("memory_limit_mib", "gauge", "integer"),
        ],
        [],
    ),
]


# (family, SI field, stored column, unit, per_unit, is_bool, is_int): how the SI views decode each column, frozen.
_DECODE = [
    ("nic", "up", "up", 1, 1, True, False),
    ("nic", "rate_bytes_per_second", "rate_kb_per_second", 1000, 1, False, False),
    ("nic", "link_width", "link_width", 1, 1, False, True),
    ("nic", "transmit_bytes_per_second", "transmit_kb_per_second", 1000, 1, False, False),
    ("nic", "receive_bytes_per_second", "receive_kb_per_second", 1000, 1, False, False),
    ("nic", "transmit_wait_per_second", "transmit_wait_per_second", 1, 1, False, False),
    ("nic", "cnp_handled_per_second", "cnp_handled_deci_per_second", 1, 10, False, False),
    *(("nic", column, column, 1, 1, False, True) for column, kind, _ in _FAMILIES[0][2] if kind == "counter"),
    ("host", "cpu_busy_ratio", "cpu_busy_per10k", 1, 10_000, False, False),
    ("host", "cpu_iowait_ratio", "cpu_iowait_per10k", 1, 10_000, False, False),
    *(
        ("host", f"memory_{m}_bytes", f"memory_{m}_mib", 1 << 20, 1, False, True)
        for m in ("used", "available", "total")
    ),
    ("job_host", "cpu_seconds_total", "cpu_milliseconds_total", 1, 1000, False, False),
    ("job_host", "cpu_used_cores", "cpu_used_centicores", 1, 100, False, False),
    ("job_host", "cpu_limit_cores", "cpu_limit_centicores", 1, 100, False, False),
    *(("job_host", f"memory_{m}_bytes", f"memory_{m}_mib", 1 << 20, 1, False, True) for m in ("used", "limit")),
]
_CODES = [
    ("state", "state_code", ("DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER")),
    (
        "phys_state",
        "phys_state_code",
        ("Sleep", "Polling", "Disabled", "PortConfigurationTraining", "LinkUp", "LinkErrorRecovery", "Phy Test"),
    ),
    ("link_speed", "link_speed_code", ("SDR", "DDR", "QDR", "FDR10", "FDR", "EDR", "HDR", "NDR", "XDR")),
]


def _fields(family: str, columns: list[tuple[str, str, str]]) -> list[StoredField]:
    kinds = {column: (kind, sql_type) for column, kind, sql_type in columns}
    return [
        StoredField(name, column, kinds[column][0], _TYPES[kinds[column][1]], unit, per_unit, is_bool, is_int)
        for owner, name, column, unit, per_unit, is_bool, is_int in _DECODE
        if owner == family
    ]


def _views(conn: sa.Connection) -> None:
    for family, key, columns, _ in _FAMILIES:
        fields = _fields(family, columns)
        for tier in ("raw", "1m", "1h"):
            codes = _CODES if family == "nic" and tier == "raw" else []
            conn.exec_driver_sql(views.fabric_view_sql(family, key, tier, conn.dialect.name, fields, codes))


def _seen() -> list[sa.Column[object]]:
    return [
        sa.Column("first_seen_ms", sa.BigInteger(), nullable=False),
        sa.Column("last_seen_ms", sa.BigInteger(), nullable=False),
    ]


def _dimensions() -> None:
    op.create_table(
        "nic",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("device", sa.Text(), nullable=False),
        sa.Column("port", sa.SmallInteger(), nullable=False),
        sa.Column("link_layer", sa.Text(), nullable=True),
        sa.Column("pci_bus_id", sa.Text(), nullable=True),
        sa.Column("numa_node", sa.SmallInteger(), nullable=True),
        sa.Column("gpus", sa.Text(), nullable=True),
        *_seen(),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("node", "device", "port", name="uq_nic_node_device_port"),
    )
    op.create_table(
        "host",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("cpus", sa.SmallInteger(), nullable=True),
        *_seen(),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("node"),
    )
    op.create_table(
        "job_host",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("cgroup", sa.Text(), nullable=True),
        sa.Column("cgroup_version", sa.SmallInteger(), nullable=True),
        *_seen(),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("node", "job_id", name="uq_job_host_node_job"),
    )
    op.create_index("ix_job_host_job_id", "job_host", ["job_id"], unique=False)


def _samples(family: str, key: str, fields: list[tuple[str, str, str]], raw: list[str]) -> None:
    table = f"{family}_sample"
    columns = [
        (key, "integer", False),
        ("ts_ms", "bigint", False),
        *((column, kind, column != "up") for column, _, kind in fields),
        *((column, "smallint", True) for column in raw),
    ]
    widest_first = sorted(columns, key=lambda c: -_WIDTHS[c[1]])  # no alignment padding inside a PostgreSQL row
    op.create_table(
        table,
        *[sa.Column(column, _TYPES[kind](), nullable=nullable) for column, kind, nullable in widest_first],
        postgresql_partition_by="RANGE (ts_ms)",
    )
    if op.get_context().dialect.name == "postgresql":
        op.create_index(f"ux_{table}_key_ts", table, [key, "ts_ms"], unique=True)
        op.create_index(
            f"ix_{table}_ts_brin", table, ["ts_ms"], postgresql_using="brin", postgresql_with={"autosummarize": "on"}
        )
    else:
        op.create_index(f"ux_{table}_minute_key_ts", table, [sa.text("(ts_ms / 60000)"), key, "ts_ms"], unique=True)


def _rollups(family: str, key: str, fields: list[tuple[str, str, str]]) -> None:
    for tier in ("1m", "1h"):
        columns: list[sa.Column[object]] = [
            sa.Column("n", sa.Integer(), nullable=False),
            sa.Column("elapsed_ms", sa.BigInteger(), nullable=True),
        ]
        for column, kind, sql_type in fields:
            if kind == "counter":
                columns.append(sa.Column(f"{column}_increase", sa.BigInteger(), nullable=True))
            else:
                columns.append(sa.Column(f"{column}_min", _TYPES[sql_type](), nullable=True))
                columns.append(sa.Column(f"{column}_mean", sa.Double(), nullable=True))
                columns.append(sa.Column(f"{column}_max", _TYPES[sql_type](), nullable=True))
        op.create_table(
            f"{family}_rollup_{tier}",
            sa.Column(key, sa.Integer(), nullable=False),
            sa.Column("ts_ms", sa.BigInteger(), nullable=False),
            *columns,
            sa.PrimaryKeyConstraint(key, "ts_ms"),
            sqlite_with_rowid=False,
            postgresql_partition_by="RANGE (ts_ms)",
        )


def upgrade() -> None:
    _dimensions()
    for family, key, fields, raw in _FAMILIES:
        _samples(family, key, fields, raw)
        _rollups(family, key, fields)
    _views(op.get_bind())


def downgrade() -> None:
    for family, _, _, _ in _FAMILIES:
        for table in (f"{family}_sample", f"{family}_rollup_1m", f"{family}_rollup_1h"):
            op.execute(f"DROP VIEW IF EXISTS {table}_si")
    for family, _, _, _ in reversed(_FAMILIES):
        for table in (f"{family}_rollup_1h", f"{family}_rollup_1m", f"{family}_sample"):
            op.drop_table(table)
    for table in ("job_host", "host", "nic"):
        op.drop_table(table)
