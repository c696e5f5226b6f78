"""The SQL schema: tables, and the integer encodings of GpuReading fields (PostgreSQL's partitions: storage.partitions).

Time-series tables key rows by ``(gpu_id, ts_ms)``: ``gpu_id`` is the small integer id of the ``gpu`` table, where
static GPU and node info is kept once, and ``ts_ms`` is integer milliseconds since the epoch. Low-volume tables (target
health, alerts) store float seconds in ``*_at`` columns. See docs/storage-schema.md for the reasoning.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Final

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from gpulens.model import THROTTLE_SOURCES, GpuReading
from gpulens.storage.records import READABLE_FIELDS
from gpulens.storedrange import BYTES_TYPE, GPU_INDEX_TYPE, LINK_TYPE, PID_TYPE, SQL_INT_MAX, encoding

metadata: Final = sa.MetaData()

MINUTE_MS: Final = 60_000
HOUR_MS: Final = 3_600_000
DAY_MS: Final = 86_400_000

# The SQL integer types used for encoded values (their names and ranges: gpulens.storedrange, the one table).
SQL_TYPES: Final[dict[str, type[sa.types.TypeEngine[int]]]] = {
    "smallint": sa.SmallInteger,
    "integer": sa.Integer,
    "bigint": sa.BigInteger,
}
_INT_RANGES: Final[dict[type[sa.types.TypeEngine[int]], int]] = {
    SQL_TYPES[name]: limit for name, limit in SQL_INT_MAX.items()
}


@dataclass(frozen=True, slots=True)
class StoredField:
    """One numeric GpuReading field as a column: SI value = stored * unit / per_unit.

    ``name`` is the field's catalogue name, in SI units (``power_watts``); ``column`` is the stored column, named by
    the unit it holds (``power_deciwatts``): see ``STORED_UNITS``. ``kind`` decides how the field is aggregated:
    gauges get min/mean/max, counters an increase (rates are derived at query time, counter resets handled),
    bitmasks a bitwise OR.
    """

    name: str
    column: str
    kind: str  # "gauge" | "counter" | "bitmask"
    sql_type: type[sa.types.TypeEngine[int]]
    unit: int = 1
    per_unit: int = 1
    is_bool: bool = False
    is_int: bool = False  # the GpuReading field is an int (decode to int)
    profile: bool = False  # stored once per distinct combination in ``gpu_profile``, not in every sample row
    codes: tuple[str, ...] = ()  # a text field's words, stored as bits 1, 2, 4...; a mixed rollup bucket reads NULL

    @property
    def limit(self) -> int:
        return _INT_RANGES[self.sql_type]

    @property
    def pg_param_type(self) -> str:
        """The type the SI value is sent as to PostgreSQL (an int of any size arrives as numeric)."""
        return "text" if self.codes else "boolean" if self.is_bool else "numeric" if self.is_int else "double precision"

    @property
    def aggregates(self) -> tuple[str, ...]:
        """The suffixes of this field's rollup columns (and of its SI columns in the rollup views)."""
        return AGGREGATES[self.kind]

    def sql_encode(self, value: str, dialect: str) -> str:
        """SQL turning the SI value ``value`` (a parameter or column) into the stored integer; NULL if it won't fit.

        Encoding in SQL keeps the writer's Python work per reading to building one tuple.
        """
        if self.codes:
            return "CASE {} {} END".format(
                value, " ".join(f"WHEN '{w}' THEN {1 << i}" for i, w in enumerate(self.codes))
            )
        if self.is_bool:
            # sqlite3 binds Python booleans as 1 and 0; PostgreSQL stages them as booleans.
            return f"CASE WHEN {value} THEN 1 WHEN NOT {value} THEN 0 END" if dialect == "postgresql" else value
        scaled = value if self.unit == self.per_unit else f"({value} * {self.per_unit / self.unit!r})"
        rounded = value if self.is_int and self.unit == self.per_unit else f"round({scaled})"
        if dialect == "sqlite" and rounded == value:  # a Python int binds as an SQLite integer already
            return f"CASE WHEN {value} BETWEEN {-self.limit} AND {self.limit} THEN {value} END"
        cast = "bigint" if dialect == "postgresql" else "INTEGER"
        return f"CASE WHEN {scaled} BETWEEN {-self.limit} AND {self.limit} THEN CAST({rounded} AS {cast}) END"

    def sql_decode(self, column: str, dialect: str) -> str:
        """SQL turning the stored-unit ``column`` (or an aggregate of it) into SI units.

        Booleans stay 0/1: SQL has no portable bool. A coded field reads as its word.
        """
        if self.codes:
            return "CASE {} {} END".format(
                column, " ".join(f"WHEN {1 << i} THEN '{w}'" for i, w in enumerate(self.codes))
            )
        if self.is_bool or (self.unit == 1 and self.per_unit == 1):
            return column
        if self.is_int:  # widened first: KiB in a PostgreSQL integer times 1024 overflows it
            return f"CAST({column} AS BIGINT) * {self.unit}" if dialect == "postgresql" else f"{column} * {self.unit}"
        real = f"CAST({column} AS {'DOUBLE PRECISION' if dialect == 'postgresql' else 'REAL'})"
        return f"{real} / {self.per_unit}" if self.per_unit != 1 else f"{real} * {self.unit}"

    def to_si(self, stored: float) -> float:
        """A stored-unit quantity (an average, a rate, a spread) in SI units, as a float."""
        return stored * self.unit / self.per_unit


# Rollup columns are ``<column>_<aggregate>``, by field kind; the SI views name theirs ``<field>_<aggregate>``.
AGGREGATES: Final[dict[str, tuple[str, ...]]] = {
    "gauge": ("min", "mean", "max"),
    "counter": ("increase",),
    "bitmask": ("or",),
}


def _stored_field(name: str, annotation: str, kind: str) -> StoredField:
    """The field's column, from its encoding in ``gpulens.storedrange`` (where the readers' bounds come from too)."""
    enc = encoding(name, annotation, kind)
    return StoredField(
        name,
        enc.column,
        kind,
        SQL_TYPES[enc.sql_type],
        unit=enc.unit,
        per_unit=enc.per_unit,
        is_bool=enc.is_bool,
        is_int=enc.is_int,
    )


# The fields that change seldom on a GPU (limits, maxima, link widths, remapped rows): revision 0008 keeps each
# distinct combination of their values once, in ``gpu_profile``, and a sample row names its combination by
# ``profile_id``. A GPU's row then carries 15 columns fewer (see docs/storage-schema.md, "Profiles"). Error counters
# stay in the row: on a faulty GPU they grow every sample, and each value would be a new combination, kept for good.
PROFILE_FIELDS: Final = (
    *("memory_total_bytes", "memory_reserved_bytes", "slowdown_temperature_celsius", "power_limit_watts"),
    *("max_sm_clock_hertz", "max_memory_clock_hertz"),
    *("pcie_link_generation", "pcie_link_generation_max", "pcie_link_width", "pcie_link_width_max"),
    "nvlink_links_active",
    *("remapped_rows_correctable", "remapped_rows_uncorrectable", "remapped_rows_pending", "remapped_rows_failure"),
)


def _sample_fields() -> tuple[StoredField, ...]:
    """A column for each field of the readers' catalogue (``storage.records.READABLE_FIELDS``), in its order."""
    annotations = {f.name: str(f.type) for f in dataclasses.fields(GpuReading)}
    special = {
        "throttle_reasons_source": StoredField(
            *("throttle_reasons_source",) * 2, "bitmask", sa.SmallInteger, codes=THROTTLE_SOURCES
        ),
        "xid_total": StoredField("xid_total", "xid_total", "counter", sa.Integer, is_int=True),
    }
    fields = [special.get(f.name) or _stored_field(f.name, annotations[f.name], f.kind) for f in READABLE_FIELDS]
    return tuple(dataclasses.replace(f, profile=f.name in PROFILE_FIELDS) for f in fields)


# Every numeric column of a sample row, in column order. ``xid_total`` is the sum of the per-code XID counters; the
# per-code counts themselves are kept as compact JSON in ``xid_errors`` (NULL when there are none).
SAMPLE_FIELDS: Final[tuple[StoredField, ...]] = _sample_fields()
FIELD_BY_NAME: Final[dict[str, StoredField]] = {f.name: f for f in SAMPLE_FIELDS}
if {f.name for f in SAMPLE_FIELDS if f.profile} != set(PROFILE_FIELDS):  # pragma: no cover (a catalogue rename)
    raise TypeError("PROFILE_FIELDS names a field that is not stored")

# --- static info --------------------------------------------------------------------------------------------------

gpu: Final = sa.Table(
    "gpu",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("uuid", sa.Text, nullable=False, unique=True),
    sa.Column("node", sa.Text, nullable=False),
    sa.Column("gpu_index", SQL_TYPES[GPU_INDEX_TYPE], nullable=False),
    sa.Column("model", sa.Text, nullable=False),
    sa.Column("pci_bus_id", sa.Text),
    sa.Column("driver_version", sa.Text),
    sa.Column("mig_enabled", sa.Boolean(create_constraint=False)),
    sa.Column("first_seen_ms", sa.BigInteger, nullable=False),
    sa.Column("last_seen_ms", sa.BigInteger, nullable=False),
)

# --- time series --------------------------------------------------------------------------------------------------

# SQLite's raw sample tables (GPUs and the fabric's) store a sample's time as two small integers, the first and last
# columns of their primary key (revisions 0010 and 0011): ``minute``, the minute counted from 2020-01-01T00:00Z
# (3 bytes a row until 2035, where minutes since 1970 take 4), and ``ms``, the millisecond within that minute less
# half a minute (-30000 to 29999: 2 bytes, where 0 to 59999 take 3). ``ts_ms`` is a virtual generated column over the
# two, stored nowhere, so every read names it as on PostgreSQL; an insert gives ``minute`` and ``ms`` instead. A
# seek names ``minute``: SQLite keys no generated column. PostgreSQL's tables have neither column: schema objects
# marked ``SQLITE_ONLY`` exist on SQLite alone.
MINUTE: Final = "minute"
MS: Final = "ms"
MINUTE_BASE: Final = 26_297_280  # 2020-01-01T00:00Z in minutes since 1970
HALF_MINUTE_MS: Final = 30_000
SQLITE_ONLY: Final = {"dialects": ("sqlite",)}


def minute_column() -> sa.Column[int]:
    """The stored minute of a raw sample table (SQLite only)."""
    return sa.Column(MINUTE, sa.Integer, nullable=False, info=dict(SQLITE_ONLY))


def ms_column() -> sa.Column[int]:
    """The stored millisecond within the minute, less half a minute, of a raw sample table (SQLite only)."""
    return sa.Column(MS, sa.SmallInteger, nullable=False, info=dict(SQLITE_ONLY))


def minute_of(ts_ms: str) -> str:
    """SQL of the minute a non-negative ``ts_ms`` expression falls in: the value stored in the ``minute`` column."""
    return f"(({ts_ms}) / {MINUTE_MS} - {MINUTE_BASE})"


def ms_of(ts_ms: str) -> str:
    """SQL of the value stored in the ``ms`` column for a non-negative ``ts_ms`` expression."""
    return f"(({ts_ms}) % {MINUTE_MS} - {HALF_MINUTE_MS})"


def stored_minute(ts_ms: int) -> int:
    """The minute ``ts_ms`` falls in, as ``minute_of`` computes it in SQL (for a non-negative ``ts_ms``)."""
    return ts_ms // MINUTE_MS - MINUTE_BASE


def minute_start(minute: str) -> str:
    """SQL of the first ``ts_ms`` of a stored minute."""
    return f"(({minute}) + {MINUTE_BASE}) * {MINUTE_MS}"


def sqlite_ts_ms() -> str:
    """The SQL of SQLite's generated ``ts_ms`` column, from the two stored ones."""
    return f"({MINUTE} + {MINUTE_BASE}) * {MINUTE_MS} + {MS} + {HALF_MINUTE_MS}"


def sqlite_sample_insert(columns: list[str], values: list[str]) -> tuple[list[str], list[str]]:
    """The columns and values of an insert into an SQLite raw sample table, from those that name ``ts_ms``: its
    value goes into the stored minute and millisecond instead (the expression is evaluated twice)."""
    i = columns.index("ts_ms")
    ts = values[i]
    return [*columns[:i], *columns[i + 1 :], MINUTE, MS], [*values[:i], *values[i + 1 :], minute_of(ts), ms_of(ts)]


def _sample_table() -> sa.Table:
    """The raw samples, with a unique key for idempotent inserts.

    SQLite clusters the rows by minute (revisions 0010, 0011): a ``WITHOUT ROWID`` table whose primary key is
    ``(minute, gpu_id, ms)``, the time stored as two small integers (see ``MINUTE``; SQLite keys no expression). A
    round then touches the pages of one minute instead of one page per GPU, which keeps inserts fast when the table
    is large, and the key is the table: no second copy of it in an index (measured in docs/storage-schema.md). One GPU's
    range is read with one seek per minute. PostgreSQL has no ``minute`` column: it indexes ``(gpu_id, ts_ms)``
    within each day partition, and orders the columns widest first (revision 0007): no alignment padding in a row.
    """
    columns: list[sa.Column[object]] = [
        sa.Column("gpu_id", sa.Integer, nullable=False),
        sa.Column("ts_ms", sa.BigInteger, nullable=False),
        *_sample_columns(),
    ]
    table = sa.Table(
        "gpu_sample",
        metadata,
        minute_column(),
        ms_column(),
        *sorted(columns, key=_pg_width, reverse=True),  # stable: ties keep their order
        sa.PrimaryKeyConstraint(MINUTE, "gpu_id", MS, info=dict(SQLITE_ONLY)),
        sqlite_with_rowid=False,
        postgresql_partition_by="RANGE (ts_ms)",
    )
    sa.Index("ux_gpu_sample_gpu_ts", table.c.gpu_id, table.c.ts_ms, unique=True).ddl_if(dialect="postgresql")
    # Rollups read time ranges across all GPUs: rows arrive in time order, so a BRIN index is tiny. autosummarize has
    # autovacuum summarize each filled block range; until then a range is read whatever the query.
    sa.Index(
        "ix_gpu_sample_ts_brin", table.c.ts_ms, postgresql_using="brin", postgresql_with={"autosummarize": "on"}
    ).ddl_if(dialect="postgresql")
    return table


def _rollup_table(name: str) -> sa.Table:
    # Written in batches once a minute or hour and read one GPU at a time: clustered by (gpu_id, ts_ms). Columns
    # widest first, as for the samples (revision 0007).
    columns: list[sa.Column[object]] = [
        sa.Column("gpu_id", sa.Integer, nullable=False),
        sa.Column("ts_ms", sa.BigInteger, nullable=False),
        *_rollup_columns(),
    ]
    return sa.Table(
        name,
        metadata,
        *sorted(columns, key=_pg_width, reverse=True),
        sa.PrimaryKeyConstraint("gpu_id", "ts_ms"),
        sqlite_with_rowid=False,
        postgresql_partition_by="RANGE (ts_ms)",
    )


# Columns narrowed on PostgreSQL by revision 0004 (smallint <- integer <- bigint). SQLite keeps declaring the wider
# type of 0003: it stores each integer in as few bytes as its value needs whatever the declaration, and retyping a
# column there would copy the whole table.
_NARROWED_IN_0004: Final = {
    *("memory_used_kib", "memory_total_kib", "memory_reserved_kib", "pcie_tx_kb_per_second", "pcie_rx_kb_per_second"),
    *("sm_clock_mhz", "memory_clock_mhz", "max_sm_clock_mhz", "max_memory_clock_mhz", "nvlink_links_active"),
    *("pcie_link_generation", "pcie_link_generation_max", "pcie_link_width", "pcie_link_width_max"),
    *("remapped_rows_correctable", "remapped_rows_uncorrectable", "pcie_replays_total", "xid_total"),
    *("nvlink_crc_flit_errors_total", "nvlink_replay_errors_total", "nvlink_recovery_errors_total"),
    *("ecc_corrected_errors_total", "ecc_uncorrected_errors_total"),
}
_WIDER: Final[dict[type[sa.types.TypeEngine[int]], type[sa.types.TypeEngine[int]]]] = {
    sa.SmallInteger: sa.Integer,
    sa.Integer: sa.BigInteger,
}


def _column_type(f: StoredField) -> sa.types.TypeEngine[int]:
    """The type of ``f``'s sample column and of its rollup min/max columns."""
    if f.column not in _NARROWED_IN_0004:
        return f.sql_type()
    return f.sql_type().with_variant(_WIDER[f.sql_type](), "sqlite")


def _pg_width(column: sa.Column[object]) -> int:
    """The bytes of a column's PostgreSQL type (0 for the text, which goes last)."""
    kind = column.type.dialect_impl(postgresql.dialect())  # type: ignore[no-untyped-call]
    if isinstance(kind, sa.Float):
        return 8  # double precision
    if not isinstance(kind, sa.Integer):
        return 0
    return 8 if isinstance(kind, sa.BigInteger) else 2 if isinstance(kind, sa.SmallInteger) else 4


def _sample_columns() -> list[sa.Column[object]]:
    columns: list[sa.Column[object]] = [
        sa.Column(f.column, _column_type(f), nullable=f.name != "up") for f in SAMPLE_FIELDS if not f.profile
    ]
    columns.append(sa.Column("profile_id", sa.Integer, nullable=False))
    columns.append(sa.Column("xid_errors", sa.Text))
    return columns


def _rollup_columns() -> list[sa.Column[object]]:
    columns: list[sa.Column[object]] = [
        sa.Column("n", sa.Integer, nullable=False),  # samples in the bucket
        sa.Column("elapsed_ms", sa.BigInteger),  # sum of the gaps to each sample's predecessor (rate denominator)
    ]
    for f in SAMPLE_FIELDS:
        for aggregate in f.aggregates:
            sql_type = (
                sa.Double() if aggregate == "mean" else sa.BigInteger() if aggregate == "increase" else _column_type(f)
            )
            columns.append(sa.Column(f"{f.column}_{aggregate}", sql_type))
    return columns


gpu_sample: Final = _sample_table()

# Each distinct combination of the profile fields' stored values, once (revision 0008). ``key`` identifies a
# combination for the writers: the JSON of its SI values as read (or, for rows converted by the migration, of the
# stored values); two keys may hold the same stored values, which reads cannot tell apart.
gpu_profile: Final = sa.Table(
    "gpu_profile",
    metadata,
    sa.Column("profile_id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("key", sa.Text, nullable=False, unique=True),
    *(sa.Column(f.column, _column_type(f)) for f in SAMPLE_FIELDS if f.profile),
)


def sample_source(dialect: str, sample: str = "gpu_sample", profile: str = "gpu_profile") -> str:
    """The FROM clause that reads every field of the raw GPU samples: each row joined with its profile.

    Column names are unique across the two tables, so a query names them unqualified. On SQLite, CROSS JOIN keeps
    the samples as the outer loop (along their primary key), the profile a primary-key lookup per row.
    """
    join = "CROSS JOIN" if dialect == "sqlite" else "JOIN"
    return f"{sample} {join} {profile} USING (profile_id)"


def newest_sample_ms(dialect: str) -> sa.ScalarSelect[int]:
    """A correlated subquery: the ts_ms of the newest sample of the ``gpu`` row in the enclosing query.

    The writer moves ``gpu.last_seen_ms`` when a sample is a minute or more newer than it, so the newest sample always
    lies in ``[last_seen_ms, last_seen_ms + 1 minute)``: a bounded seek on either backend.
    """
    g, s = gpu, gpu_sample
    width = sa.literal_column(str(MINUTE_MS), sa.BigInteger)
    conditions = [s.c.gpu_id == g.c.id, s.c.ts_ms >= g.c.last_seen_ms, s.c.ts_ms < g.c.last_seen_ms + width]
    if dialect == "sqlite":  # the two minutes of the primary key the window can touch
        minute = g.c.last_seen_ms // width - sa.literal_column(str(MINUTE_BASE), sa.BigInteger)
        conditions.append(s.c[MINUTE].in_([minute, minute + sa.literal_column("1", sa.BigInteger)]))
    return sa.select(sa.func.max(s.c.ts_ms)).where(*conditions).scalar_subquery()


gpu_rollup_1m: Final = _rollup_table("gpu_rollup_1m")
gpu_rollup_1h: Final = _rollup_table("gpu_rollup_1h")

# Rollup bookkeeping: per tier, everything below position_ms is rolled up; horizon_ms is the retention cutoff last
# applied (data older than it may be gone). Late writes below a position leave a rollup_dirty mark.
tier_state: Final = sa.Table(
    "tier_state",
    metadata,
    sa.Column("tier", sa.Text, primary_key=True),
    sa.Column("position_ms", sa.BigInteger),
    sa.Column("horizon_ms", sa.BigInteger),
)
rollup_dirty: Final = sa.Table(
    "rollup_dirty",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("tier", sa.Text, nullable=False),
    sa.Column("from_ms", sa.BigInteger, nullable=False),
)
TIERS: Final = ("raw", "1m", "1h")

# --- jobs, processes, links (written when they change, not every scrape) ------------------------------------------

job_allocation: Final = sa.Table(
    "job_allocation",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.Text, nullable=False),
    sa.Column("gpu_id", sa.Integer, sa.ForeignKey("gpu.id", ondelete="CASCADE"), nullable=False),
    sa.Column("user_name", sa.Text),
    sa.Column("start_ms", sa.BigInteger, nullable=False),  # first reading that showed the job on the GPU
    sa.Column("end_ms", sa.BigInteger),  # last reading that showed it; NULL while it is still there
    sa.UniqueConstraint("gpu_id", "job_id", "start_ms"),
    sa.Index("ix_job_allocation_job_id", "job_id"),
    sa.Index("ix_job_allocation_start_ms", "start_ms"),
)
process_latest: Final = sa.Table(
    "process_latest",
    metadata,
    sa.Column("gpu_id", sa.Integer, sa.ForeignKey("gpu.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("pid", SQL_TYPES[PID_TYPE], primary_key=True),
    sa.Column("seen_ms", sa.BigInteger, nullable=False),
    sa.Column("memory_used_bytes", SQL_TYPES[BYTES_TYPE]),
    sa.Column("command", sa.Text),
    sa.Column("user_name", sa.Text),
    sa.Column("job_id", sa.Text),
)
nvlink_down: Final = sa.Table(
    "nvlink_down",
    metadata,
    sa.Column("gpu_id", sa.Integer, sa.ForeignKey("gpu.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("link", SQL_TYPES[LINK_TYPE], primary_key=True),
    sa.Column("start_ms", sa.BigInteger, primary_key=True),  # first reading that showed the link inactive
    sa.Column("end_ms", sa.BigInteger),  # last reading that showed it inactive; NULL while it still is
    sa.Column("remote_pci_bus_id", sa.Text),
)

# --- collector ----------------------------------------------------------------------------------------------------

target_health: Final = sa.Table(
    "target_health",
    metadata,
    sa.Column("target", sa.Text, primary_key=True),
    sa.Column("url", sa.Text, nullable=False),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("node", sa.Text),
    sa.Column("up", sa.Boolean(create_constraint=False), nullable=False),
    sa.Column("at", sa.Double, nullable=False),
    sa.Column("scrape_duration_seconds", sa.Double),
    sa.Column("samples", sa.Integer, nullable=False),
    sa.Column("rejected", sa.Integer, nullable=False),
    sa.Column("last_error", sa.Text),
)

# --- alerts (used by the alerts issue) ----------------------------------------------------------------------------

_JSON: Final = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

alert_state: Final = sa.Table(
    "alert_state",
    metadata,
    sa.Column("fingerprint", sa.Text, primary_key=True),
    sa.Column("rule", sa.Text, nullable=False),
    sa.Column("state", sa.Text, nullable=False),  # "pending" | "firing" | "resolved"
    sa.Column("labels", _JSON, nullable=False),
    sa.Column("annotations", _JSON, nullable=False),
    sa.Column("value", sa.Double),
    sa.Column("active_at", sa.Double, nullable=False),
    sa.Column("fired_at", sa.Double),
    sa.Column("resolved_at", sa.Double),
    sa.Column("last_eval_at", sa.Double, nullable=False),
    sa.Column("last_notified_at", sa.Double),
    # v0002: the engine's whole AlertState as JSON (what a restarted collector resumes from), and why it is muted
    sa.Column("muted", sa.Text),
    sa.Column("document", _JSON),
    sa.Index("ix_alert_state_state", "state"),
)
# v0002: Alertmanager-like notification groups (group_wait / group_interval / repeat_interval bookkeeping)
alert_group: Final = sa.Table(
    "alert_group",
    metadata,
    sa.Column("key", sa.Text, primary_key=True),
    sa.Column("state", _JSON, nullable=False),
    sa.Column("updated_at", sa.Double, nullable=False),
)
alert_history: Final = sa.Table(
    "alert_history",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("fingerprint", sa.Text, nullable=False),
    sa.Column("rule", sa.Text, nullable=False),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("labels", _JSON, nullable=False),
    sa.Column("value", sa.Double),
    sa.Column("at", sa.Double, nullable=False),
    sa.Index("ix_alert_history_fingerprint_at", "fingerprint", "at"),
    sa.Index("ix_alert_history_at", "at"),
)
notification_outbox: Final = sa.Table(
    "notification_outbox",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("receiver", sa.Text, nullable=False),
    sa.Column("payload", _JSON, nullable=False),
    sa.Column("status", sa.Text, nullable=False),  # "pending" | "sent" | "failed" | "superseded"
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("next_attempt_at", sa.Double, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("last_error", sa.Text),
    sa.Index("ix_notification_outbox_status_next", "status", "next_attempt_at"),
)
silence: Final = sa.Table(
    "silence",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("matchers", _JSON, nullable=False),
    sa.Column("starts_at", sa.Double, nullable=False),
    sa.Column("ends_at", sa.Double, nullable=False),
    sa.Column("comment", sa.Text, nullable=False),
    sa.Column("created_by", sa.Text, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Index("ix_silence_ends_at", "ends_at"),
)
# v0017: the engine's incidents, each verdict a JSON document (``storage.incidentstore``)
incident: Final = sa.Table(
    "incident",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("state", sa.String(16), nullable=False),  # "open" | "resolved"
    sa.Column("severity", sa.String(16), nullable=False),
    sa.Column("fired_at", sa.Double, nullable=False),
    sa.Column("resolved_at", sa.Double),
    sa.Column("updated_at", sa.Double, nullable=False),
    sa.Column("document", _JSON, nullable=False),
    sa.Index("ix_incident_state", "state"),
    sa.Index("ix_incident_fired_at", "fired_at"),
)
