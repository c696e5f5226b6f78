"""The fields that change seldom leave the sample rows: each distinct combination is kept once, in ``gpu_profile``.

Fifteen fields of a GPU reading (memory total and reserved, slowdown temperature, power limit, maximum clocks,
PCIe generation and width and their maxima, active NVLinks, remapped rows) stay the same from one scrape to the
next for days. Each sample row carried all of them: 15 values and, on SQLite, 15 header bytes a row. The error
counters (PCIe replays, NVLink, ECC) stay in the rows: on a faulty GPU they grow every sample, and each value would
make a combination of its own, kept for good. From this revision a row names its combination by ``profile_id``
and ``gpu_profile`` holds each combination's stored values once; reads join the two (``schema.sample_source``).
Every value is kept as it was stored.

The upgrade creates ``gpu_profile`` from the distinct combinations in ``gpu_sample`` (keyed ``stored:<values>``; the
writer keys the combinations it adds by their SI values), then copies the samples into a new table without the 15
columns, in batches of rows (``migrations.tablecopy``: on PostgreSQL partition by partition, keeping their names,
bounds and indexes, as revision 0007 does) while the old one is only read, then drops the old one and renames the
new one into its place. The SI views are dropped just before and created again with the same columns. The
downgrade copies the values back into the rows the same way and drops ``gpu_profile``.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import dataclasses

from alembic import op
from sqlalchemy.engine import Connection

from gpulens.storage import views
from gpulens.storage.migrations import tablecopy
from gpulens.storage.migrations.fields import fields_at
from gpulens.storage.schema import StoredField

revision = "0008"
down_revision: str | None = "0007"
branch_labels: str | None = None
depends_on: str | None = None
# The tables whose rows it copies, per backend (`gpulens db upgrade --plan`, storage/upgradeplan.py).
rewrites: dict[str, tuple[str, ...]] = {"sqlite": ("gpu_sample",), "postgresql": ("gpu_sample",)}

# The profile fields of this revision, frozen (gpulens.storage.schema.PROFILE_FIELDS may grow in later revisions).
_PROFILE = (
    *("memory_total_bytes", "memory_reserved_bytes", "slowdown_temperature_celsius", "power_limit_watts"),
    *("max_sm_clock_hertz", "max_memory_clock_hertz"),
    *("pcie_link_generation", "pcie_link_generation_max", "pcie_link_width", "pcie_link_width_max"),
    "nvlink_links_active",
    *("remapped_rows_correctable", "remapped_rows_uncorrectable", "remapped_rows_pending", "remapped_rows_failure"),
)
_PG_INDEXES = (
    "CREATE UNIQUE INDEX ux_gpu_sample_gpu_ts ON gpu_sample (gpu_id, ts_ms)",
    "CREATE INDEX ix_gpu_sample_ts_brin ON gpu_sample USING brin (ts_ms) WITH (autosummarize = on)",
)
_WIDTHS = {"bigint": 8, "double precision": 8, "integer": 4, "smallint": 2}  # PostgreSQL; the text goes last


def change_sample_fields(before: list[StoredField]) -> list[StoredField]:
    """The sample fields (unchanged since 0005), those of this revision's profile marked (see ``fields.fields_at``)."""
    return [dataclasses.replace(f, profile=f.name in _PROFILE) for f in before]


def _profile_columns() -> list[str]:
    return [f.column for f in fields_at(revision) if f.profile]


def _columns(conn: Connection, table: str) -> list[tuple[str, str, bool]]:
    """(name, SQL type, nullable) of ``table``'s columns, in their current order."""
    if conn.dialect.name == "sqlite":
        rows = conn.exec_driver_sql(f"PRAGMA table_info({table})").all()
        return [(str(row[1]), str(row[2]), not row[3]) for row in rows]
    rows = conn.exec_driver_sql(
        "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
        "WHERE table_name = %(table)s AND table_schema = current_schema() ORDER BY ordinal_position",
        {"table": table},
    ).all()
    return [(str(name), str(kind), nullable == "YES") for name, kind, nullable in rows]


def _key(dialect: str, alias: str, columns: list[str]) -> str:
    """SQL of a profile key from stored values: ``stored:`` and the values, NULL as ``null``."""
    if dialect == "sqlite":
        return "'stored:' || " + " || ',' || ".join(f"quote({alias}.{c})" for c in columns)
    return "'stored:' || concat_ws(',', " + ", ".join(f"coalesce({alias}.{c}::text, 'null')" for c in columns) + ")"


def upgrade() -> None:
    conn = op.get_bind()
    old = _columns(conn, "gpu_sample")
    profile = set(_profile_columns())
    types = {name: kind for name, kind, _ in old}
    kept = [c for c in old if c[0] not in profile]
    at = next(i for i, c in enumerate(kept) if c[0] == "xid_errors")  # the text stays last
    new = [*kept[:at], ("profile_id", "INTEGER" if conn.dialect.name == "sqlite" else "integer", False), *kept[at:]]
    _create_profiles(conn, types)
    join = f"JOIN gpu_profile AS p ON p.key = {_key(conn.dialect.name, 's', _profile_columns())}"
    _copy(conn, new, join)
    views.create_views(conn, fields_at(revision), profiles=True)


def downgrade() -> None:
    conn = op.get_bind()
    old = _columns(conn, "gpu_sample")
    profile = {name: kind for name, kind, _ in _columns(conn, "gpu_profile")}
    kept = [c for c in old if c[0] != "profile_id"]
    at = next(i for i, c in enumerate(kept) if c[0] == "xid_errors")
    new = [*kept[:at], *((c, profile[c], True) for c in _profile_columns()), *kept[at:]]
    join = "JOIN gpu_profile AS p ON p.profile_id = s.profile_id"
    _copy(conn, new, join)
    conn.exec_driver_sql("DROP TABLE gpu_profile")
    assert down_revision is not None
    views.create_views(conn, fields_at(down_revision))


def _select_list(new: list[tuple[str, str, bool]]) -> str:
    """The copy's SELECT list: profile values and ids from ``p``, the rest from the sample ``s``."""
    profile = {"profile_id", *_profile_columns()}
    return ", ".join(f"{'p' if name in profile else 's'}.{name}" for name, _, _ in new)


def _copy(conn: Connection, new: list[tuple[str, str, bool]], join: str) -> None:
    """Copy gpu_sample into a new table of the columns ``new`` in batches while it is only read, then drop the views
    that read it and swap the new table in (``migrations.tablecopy``); the caller creates the views again."""
    if conn.dialect.name == "sqlite":
        definitions = ", ".join(f"{name} {kind}{'' if nullable else ' NOT NULL'}" for name, kind, nullable in new)
        conn.exec_driver_sql(f"CREATE TABLE gpu_sample_0008 ({definitions})")
        names = ", ".join(name for name, _, _ in new)
        tablecopy.copy_batched(
            conn,
            into="gpu_sample_0008",
            names=names,
            select=_select_list(new),
            source="gpu_sample AS s",
            key="s.rowid",
            join=join,
        )
        views.drop_views(conn)
        conn.exec_driver_sql("DROP TABLE gpu_sample")
        conn.exec_driver_sql("ALTER TABLE gpu_sample_0008 RENAME TO gpu_sample")
        conn.exec_driver_sql(
            "CREATE UNIQUE INDEX ux_gpu_sample_minute_gpu_ts ON gpu_sample (ts_ms / 60000, gpu_id, ts_ms)"
        )
        return
    ordered = sorted(new, key=lambda c: -_WIDTHS.get(c[1], 0))  # widest first, as 0007; ties keep their order
    definitions = ", ".join(f"{name} {kind}{'' if nullable else ' NOT NULL'}" for name, kind, nullable in ordered)
    tablecopy.fill_partitioned(
        conn,
        "gpu_sample",
        definitions=definitions,
        indexes=_PG_INDEXES,
        names=", ".join(name for name, _, _ in ordered),
        select=_select_list(ordered),
        join=join,
    )
    views.drop_views(conn)
    tablecopy.swap_partitioned(conn, "gpu_sample")


def _create_profiles(conn: Connection, types: dict[str, str]) -> None:
    """``gpu_profile`` with a row for each distinct combination of the profile columns in ``gpu_sample``."""
    columns = _profile_columns()
    key = (
        "profile_id INTEGER NOT NULL PRIMARY KEY"  # a rowid alias all the same
        if conn.dialect.name == "sqlite"
        else "profile_id SERIAL PRIMARY KEY"  # what SQLAlchemy creates for an autoincrement integer key
    )
    definitions = ", ".join(f"{c} {types[c]}" for c in columns)
    conn.exec_driver_sql(f"CREATE TABLE gpu_profile ({key}, key TEXT NOT NULL UNIQUE, {definitions})")
    names = ", ".join(columns)
    conn.exec_driver_sql(
        f"INSERT INTO gpu_profile (key, {names}) SELECT {_key(conn.dialect.name, 'd', columns)}, {names} "  # noqa: S608
        f"FROM (SELECT DISTINCT {names} FROM gpu_sample) AS d"
    )
