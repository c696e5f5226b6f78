"""The fabric and host tables (RDMA ports, nodes' CPUs and memory, jobs' cgroups) and the series families.

Each kind of record is stored like the GPU rows (``storage.schema``): a small dimension table that keeps what rarely
changes once (``nic``: node, device, port, link layer, PCI address, nearest GPUs; ``host``: node and CPU count;
``job_host``: node, job and cgroup) and gives each row a compact integer id, a wide sample table written every round
(``nic_sample``, ``host_sample``, ``job_host_sample``: narrow integers named by their stored unit, decoded to SI on
read), and 1-minute and 1-hour rollup tables built by ``gpulens.storage.rollup``. A ``Family`` describes one such set of
tables, the GPU rows included, so rollups, retention and series reads treat every kind alike.

Port states are stored as small codes of the InfiniBand names (``NIC_CODES``), in the raw samples only; a name the
table does not know is stored as 0 and read back as ``None``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import sqlalchemy as sa

from gpulens.storage import schema
from gpulens.storage.schema import StoredField, metadata

_MIB: Final = 1024 * 1024


def _gauge(
    name: str, column: str, sql_type: type[sa.types.TypeEngine[int]], unit: int = 1, per_unit: int = 1
) -> StoredField:
    return StoredField(name, column, "gauge", sql_type, unit=unit, per_unit=per_unit)


def _counter(name: str, sql_type: type[sa.types.TypeEngine[int]] = sa.Integer) -> StoredField:
    return StoredField(name, name, "counter", sql_type, is_int=True)


def _mib(name: str) -> StoredField:
    """Byte counts in MiB in a 32-bit integer: up to 2 PiB (a host's memory passes the 2 TiB of GPUs' KiB)."""
    return StoredField(name, name.removesuffix("_bytes") + "_mib", "gauge", sa.Integer, unit=_MIB, is_int=True)


# Every numeric NicReading field stored per round, in column order. Rates in kB/s fit 32 bits up to 2.1 TB/s;
# transmit wait in whole ticks per second; CNPs in tenths per second; error counters are 8 to 32 bits wide in the
# InfiniBand PortCounters, byte counters 64.
NIC_FIELDS: Final[tuple[StoredField, ...]] = (
    StoredField("up", "up", "gauge", sa.SmallInteger, is_bool=True),
    _gauge("rate_bytes_per_second", "rate_kb_per_second", sa.Integer, unit=1000),
    StoredField("link_width", "link_width", "gauge", sa.SmallInteger, is_int=True),
    _gauge("transmit_bytes_per_second", "transmit_kb_per_second", sa.Integer, unit=1000),
    _gauge("receive_bytes_per_second", "receive_kb_per_second", sa.Integer, unit=1000),
    _gauge("transmit_wait_per_second", "transmit_wait_per_second", sa.BigInteger),
    _gauge("cnp_handled_per_second", "cnp_handled_deci_per_second", sa.Integer, per_unit=10),
    _counter("transmit_bytes_total", sa.BigInteger),
    _counter("receive_bytes_total", sa.BigInteger),
    _counter("link_downed_total"),
    _counter("symbol_errors_total"),
    _counter("receive_errors_total"),
    _counter("local_link_integrity_errors_total"),
    _counter("link_error_recovery_total"),
    _counter("transmit_discards_total", sa.BigInteger),
    _counter("cnp_handled_total", sa.BigInteger),
)
HOST_FIELDS: Final[tuple[StoredField, ...]] = (
    _gauge("cpu_busy_ratio", "cpu_busy_per10k", sa.SmallInteger, per_unit=10_000),
    _gauge("cpu_iowait_ratio", "cpu_iowait_per10k", sa.SmallInteger, per_unit=10_000),
    _mib("memory_used_bytes"),
    _mib("memory_available_bytes"),
    _mib("memory_total_bytes"),
)
JOB_HOST_FIELDS: Final[tuple[StoredField, ...]] = (
    StoredField("cpu_seconds_total", "cpu_milliseconds_total", "counter", sa.BigInteger, per_unit=1000),
    _gauge("cpu_used_cores", "cpu_used_centicores", sa.Integer, per_unit=100),
    _gauge("cpu_limit_cores", "cpu_limit_centicores", sa.Integer, per_unit=100),
    _mib("memory_used_bytes"),
    _mib("memory_limit_bytes"),
)

# Raw-only coded columns of nic_sample: (NicReading field, column, the names; code = position + 1, 0 = unknown).
# The names are the kernel's (``state`` "4: ACTIVE", ``phys_state`` "5: LinkUp", the lane speed of ``rate``).
NIC_CODES: Final[tuple[tuple[str, str, tuple[str, ...]], ...]] = (
    ("state", "state_code", ("DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER")),
    (
        "phys_state",
        "phys_state_code",
        ("Sleep", "Polling", "Disabled", "PortConfigurationTraining", "LinkUp", "LinkErrorRecovery", "Phy Test"),
    ),
    ("link_speed", "link_speed_code", ("SDR", "DDR", "QDR", "FDR10", "FDR", "EDR", "HDR", "NDR", "XDR")),
)


def encode_code(names: tuple[str, ...], value: str | None) -> int | None:
    """The stored code of ``value``: its position + 1 in ``names``, 0 for a name not there, NULL for ``None``."""
    if value is None:
        return None
    return names.index(value) + 1 if value in names else 0


def decode_code(names: tuple[str, ...], code: int | None) -> str | None:
    return names[code - 1] if code is not None and 0 < code <= len(names) else None


# --- dimension tables ---------------------------------------------------------------------------------------------

nic: Final = sa.Table(
    "nic",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("node", sa.Text, nullable=False),
    sa.Column("device", sa.Text, nullable=False),
    sa.Column("port", sa.SmallInteger, nullable=False),
    sa.Column("link_layer", sa.Text),
    sa.Column("pci_bus_id", sa.Text),
    sa.Column("numa_node", sa.SmallInteger),
    sa.Column("gpus", sa.Text),  # the nearest GPUs' indices, "4,5"; "" when none are known
    sa.Column("first_seen_ms", sa.BigInteger, nullable=False),
    sa.Column("last_seen_ms", sa.BigInteger, nullable=False),
    sa.UniqueConstraint("node", "device", "port", name="uq_nic_node_device_port"),
)
host: Final = sa.Table(
    "host",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("node", sa.Text, nullable=False, unique=True),
    sa.Column("cpus", sa.SmallInteger),
    sa.Column("first_seen_ms", sa.BigInteger, nullable=False),
    sa.Column("last_seen_ms", sa.BigInteger, nullable=False),
)
job_host: Final = sa.Table(
    "job_host",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("node", sa.Text, nullable=False),
    sa.Column("job_id", sa.Text, nullable=False),
    sa.Column("cgroup", sa.Text),
    sa.Column("cgroup_version", sa.SmallInteger),
    sa.Column("first_seen_ms", sa.BigInteger, nullable=False),
    sa.Column("last_seen_ms", sa.BigInteger, nullable=False),
    sa.UniqueConstraint("node", "job_id", name="uq_job_host_node_job"),
    sa.Index("ix_job_host_job_id", "job_id"),
)


# --- families -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Family:
    """One kind of series: its dimension table, the key column that names a dimension row, and its tier tables."""

    name: str  # "gpu" | "nic" | "host" | "job_host"
    dimension: str
    key: str
    fields: tuple[StoredField, ...]
    raw_columns: tuple[str, ...] = ()  # stored in raw samples only, never rolled up

    @property
    def sample(self) -> str:
        return f"{self.name}_sample"

    def source(self, dialect: str, fields: Sequence[StoredField] | None = None) -> str:
        """The FROM clause that reads ``fields`` (default: every field) of the raw samples: the GPU rows joined with
        their profile when a field is the profile's."""
        profiled = self.name == "gpu" and (fields is None or any(f.profile for f in fields))
        return schema.sample_source(dialect) if profiled else self.sample

    def table(self, tier: str) -> str:
        """The table of ``tier`` ("raw", "1m" or "1h")."""
        return self.sample if tier == "raw" else f"{self.name}_rollup_{tier}"

    @property
    def field_by_name(self) -> dict[str, StoredField]:
        return {f.name: f for f in self.fields}


GPU: Final = Family("gpu", "gpu", "gpu_id", schema.SAMPLE_FIELDS, ("xid_errors",))
NIC: Final = Family("nic", "nic", "nic_id", NIC_FIELDS, tuple(column for _, column, _ in NIC_CODES))
HOST: Final = Family("host", "host", "host_id", HOST_FIELDS)
JOB_HOST: Final = Family("job_host", "job_host", "job_host_id", JOB_HOST_FIELDS)
FABRIC_FAMILIES: Final = (NIC, HOST, JOB_HOST)
FAMILIES: Final = (GPU, *FABRIC_FAMILIES)


_WIDTH: Final[dict[type, int]] = {sa.BigInteger: 8, sa.Integer: 4, sa.SmallInteger: 2}


def _sample_table(family: Family) -> sa.Table:
    """Raw samples keyed like ``gpu_sample``: on SQLite a ``WITHOUT ROWID`` table keyed by ``(minute, key, ms)``
    (revisions 0010 and 0011; ``ts_ms`` generated from the two),
    on PostgreSQL a unique index on the key and time within each day partition, and a BRIN index on
    time for rollups and retention.

    The columns go widest first (8-byte, then 4-byte, then 2-byte integers): PostgreSQL aligns each value to its
    width, so this order leaves no padding inside a row (measured: 149 -> 134 bytes of heap per port row)."""
    columns: list[sa.Column[int]] = [
        sa.Column(family.key, sa.Integer, nullable=False),
        sa.Column("ts_ms", sa.BigInteger, nullable=False),
        *(sa.Column(f.column, f.sql_type(), nullable=f.name != "up") for f in family.fields),
        *(sa.Column(column, sa.SmallInteger) for column in family.raw_columns),
    ]
    table = sa.Table(
        family.sample,
        metadata,
        schema.minute_column(),
        schema.ms_column(),
        *sorted(columns, key=lambda c: -_WIDTH[type(c.type)]),
        sa.PrimaryKeyConstraint(schema.MINUTE, family.key, schema.MS, info=dict(schema.SQLITE_ONLY)),
        sqlite_with_rowid=False,
        postgresql_partition_by="RANGE (ts_ms)",
    )
    key = table.c[family.key]
    sa.Index(f"ux_{family.sample}_key_ts", key, table.c.ts_ms, unique=True).ddl_if(dialect="postgresql")
    sa.Index(
        f"ix_{family.sample}_ts_brin", table.c.ts_ms, postgresql_using="brin", postgresql_with={"autosummarize": "on"}
    ).ddl_if(dialect="postgresql")
    return table


def _rollup_table(family: Family, tier: str) -> sa.Table:
    columns: list[sa.Column[object]] = [
        sa.Column("n", sa.Integer, nullable=False),
        sa.Column("elapsed_ms", sa.BigInteger),
    ]
    for f in family.fields:
        for aggregate in f.aggregates:
            sql_type = (
                sa.Double() if aggregate == "mean" else sa.BigInteger() if aggregate == "increase" else f.sql_type()
            )
            columns.append(sa.Column(f"{f.column}_{aggregate}", sql_type))
    return sa.Table(
        family.table(tier),
        metadata,
        sa.Column(family.key, sa.Integer, nullable=False),
        sa.Column("ts_ms", sa.BigInteger, nullable=False),
        *columns,
        sa.PrimaryKeyConstraint(family.key, "ts_ms"),
        sqlite_with_rowid=False,
        postgresql_partition_by="RANGE (ts_ms)",
    )


TABLES: Final = {
    family.table(tier): _sample_table(family) if tier == "raw" else _rollup_table(family, tier)
    for family in FABRIC_FAMILIES
    for tier in schema.TIERS
}
