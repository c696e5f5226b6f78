"""SQL views of the sample tables in SI units, under the catalogue's names, for tools that read SQL directly.

The tables store compact integers named by their stored unit (``power_deciwatts``, ``memory_used_kib``); each view
decodes one table to the units and names of ``gpulens.catalogue`` (``power_watts``, ``memory_used_bytes``), with the
GPU's node, index (``gpu``), UUID and model joined from ``gpu`` and ``ts`` as a timestamp (PostgreSQL
``timestamptz``; SQLite ISO-8601 text in UTC). ``ts_ms`` stays alongside: filtering on it uses the table's indexes
and, on PostgreSQL, prunes day partitions. Rollup views name each aggregate ``<field>_<aggregate>``
(``power_watts_mean``, ``energy_joules_total_increase``) and add ``samples`` and ``elapsed_seconds``.

The views belong to the migrations (a migration that changes the sample columns drops and recreates them); each
migration passes the field list of its own revision, so an old migration keeps building the views of its time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from sqlalchemy.engine import Connection

from gpulens.storage.schema import StoredField

VIEWS: Final = {"gpu_sample": "gpu_sample_si", "gpu_rollup_1m": "gpu_rollup_1m_si", "gpu_rollup_1h": "gpu_rollup_1h_si"}


def view_sql(table: str, dialect: str, fields: Sequence[StoredField], profiles: bool = False) -> str:
    """``CREATE VIEW`` of ``table`` (a key of ``VIEWS``) in SI units on ``dialect``.

    ``profiles``: the schema keeps the fields marked ``profile`` in ``gpu_profile`` (revision 0008 on), joined here.
    """
    real = "DOUBLE PRECISION" if dialect == "postgresql" else "REAL"
    ts = (
        "to_timestamp(s.ts_ms / 1000.0)"
        if dialect == "postgresql"
        else "strftime('%Y-%m-%dT%H:%M:%fZ', s.ts_ms / 1000.0, 'unixepoch')"
    )
    columns = [f"{ts} AS ts", "s.ts_ms", "g.node", "g.gpu_index AS gpu", "g.uuid", "g.model"]
    join = ""
    if table == "gpu_sample":
        aliases = {f.name: "p" if profiles and f.profile else "s" for f in fields}
        columns += [f"{f.sql_decode(f'{aliases[f.name]}.{f.column}', dialect)} AS {f.name}" for f in fields]
        columns.append("s.xid_errors")
        join = " JOIN gpu_profile AS p ON p.profile_id = s.profile_id" if profiles else ""
    else:
        columns += ["s.n AS samples", f"CAST(s.elapsed_ms AS {real}) / 1000 AS elapsed_seconds"]
        columns += [
            f"{f.sql_decode(f's.{f.column}_{aggregate}', dialect)} AS {f.name}_{aggregate}"
            for f in fields
            for aggregate in f.aggregates
        ]
    return (
        f"CREATE VIEW {VIEWS[table]} AS SELECT {', '.join(columns)} "  # noqa: S608 (constant identifiers)
        f"FROM {table} AS s JOIN gpu AS g ON g.id = s.gpu_id{join}"
    )


def create_views(conn: Connection, fields: Sequence[StoredField], profiles: bool = False) -> None:
    """Create the SI view of every sample table, for a schema whose sample columns are ``fields`` (``profiles``:
    those marked ``profile`` are in ``gpu_profile``, revision 0008 on)."""
    for table in VIEWS:
        conn.exec_driver_sql(view_sql(table, conn.dialect.name, fields, profiles))


def drop_views(conn: Connection) -> None:
    for view in VIEWS.values():
        conn.exec_driver_sql(f"DROP VIEW IF EXISTS {view}")


# --- the fabric and host tables (revision 0006) -------------------------------------------------------------------

FABRIC_DIMENSIONS: Final = {
    "nic": ("node", "device", "port", "link_layer", "gpus"),
    "host": ("node",),
    "job_host": ("node", "job_id"),
}
Codes = Sequence[tuple[str, str, Sequence[str]]]  # (SI name, stored code column, the names; code = position + 1)


def fabric_view_sql(
    family: str, key: str, tier: str, dialect: str, fields: Sequence[StoredField], codes: Codes = ()
) -> str:
    """``CREATE VIEW <table>_si`` of one fabric family's tier table (``raw``, ``1m``, ``1h``) in SI units, with its
    dimension's columns joined and (raw rows) the coded states as their names."""
    real = "DOUBLE PRECISION" if dialect == "postgresql" else "REAL"
    table = f"{family}_sample" if tier == "raw" else f"{family}_rollup_{tier}"
    ts = (
        "to_timestamp(s.ts_ms / 1000.0)"
        if dialect == "postgresql"
        else "strftime('%Y-%m-%dT%H:%M:%fZ', s.ts_ms / 1000.0, 'unixepoch')"
    )
    columns = [f"{ts} AS ts", "s.ts_ms", *(f"d.{c}" for c in FABRIC_DIMENSIONS[family])]
    if tier == "raw":
        columns += [f"{f.sql_decode(f's.{f.column}', dialect)} AS {f.name}" for f in fields]
        for name, column, names in codes:
            cases = " ".join(f"WHEN {i} THEN '{value}'" for i, value in enumerate(names, start=1))
            columns.append(f"CASE s.{column} {cases} END AS {name}")
    else:
        columns += ["s.n AS samples", f"CAST(s.elapsed_ms AS {real}) / 1000 AS elapsed_seconds"]
        columns += [
            f"{f.sql_decode(f's.{f.column}_{aggregate}', dialect)} AS {f.name}_{aggregate}"
            for f in fields
            for aggregate in f.aggregates
        ]
    return (
        f"CREATE VIEW {table}_si AS SELECT {', '.join(columns)} "  # noqa: S608 (constant identifiers)
        f"FROM {table} AS s JOIN {family} AS d ON d.id = s.{key}"
    )
