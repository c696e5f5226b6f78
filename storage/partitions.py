"""PostgreSQL range partitions of the time-series tables: their width, names and bounds, and creating one.

Each raw sample and 1-minute rollup table is partitioned by day, each 1-hour rollup table by 30 days, aligned to the
epoch (1-day partitions start at midnight UTC), so retention drops whole partitions. SQLite has no partitions.
"""

from __future__ import annotations

import datetime as dt
from typing import Final

from sqlalchemy.engine import Connection

from gpulens.storage.schema import DAY_MS

# Their width per table.
PARTITION_WIDTH_MS: Final = {
    f"{family}_{table}": width
    for family in ("gpu", "nic", "host", "job_host")  # the families of gpulens.storage.fabricschema
    for table, width in (("sample", DAY_MS), ("rollup_1m", DAY_MS), ("rollup_1h", 30 * DAY_MS))
}


def partition_name(table: str, start_ms: int) -> str:
    """``gpu_sample_p20240131``: the partition of ``table`` that starts at ``start_ms`` (UTC date)."""
    day = dt.datetime.fromtimestamp(start_ms / 1000, tz=dt.UTC)
    return f"{table}_p{day:%Y%m%d}"


def partition_start(table: str, ts_ms: int) -> int:
    width = PARTITION_WIDTH_MS[table]
    return ts_ms - ts_ms % width


def existing_partitions(conn: Connection, table: str) -> dict[str, int]:
    """The partitions of ``table`` on PostgreSQL: name -> start_ms, read from the catalogue's partition bounds."""
    rows = conn.exec_driver_sql(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
        "JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent "
        "WHERE p.relname = %(table)s AND p.relnamespace = to_regnamespace(current_schema())::oid",
        {"table": table},
    ).all()
    out: dict[str, int] = {}
    for name, bound in rows:
        # "FOR VALUES FROM ('1700006400000') TO ('1700092800000')"
        start = str(bound).split("(", 1)[1].split(")", 1)[0].strip("'")
        out[str(name)] = int(start)
    return out


def create_partition(conn: Connection, table: str, start_ms: int) -> None:
    """Create the partition of ``table`` that starts at ``start_ms`` unless it exists."""
    width = PARTITION_WIDTH_MS[table]
    name = partition_name(table, start_ms)
    conn.exec_driver_sql(
        f'CREATE TABLE IF NOT EXISTS "{name}" PARTITION OF "{table}" '
        f"FOR VALUES FROM ({int(start_ms)}) TO ({int(start_ms + width)})"
    )
