"""Copying a big table in a migration: in batches, into a new table, swapped in at the end.

A migration that rewrites a sample table (a new column order, fields moved out, a new key) never changes the live
table while it copies. It fills a new table beside it with one ``INSERT ... SELECT`` per range of a key of about
``BATCH_ROWS`` rows (``copy_batched``), reading the live table only: on PostgreSQL that takes ACCESS SHARE, so the
dashboard's readers go on reading while the copy runs, and on SQLite readers read the old rows as before. Only at
the end is the old table dropped and the new one renamed into its place (``swap_partitioned`` on PostgreSQL, a
``DROP`` and ``RENAME`` on SQLite): the one short moment that takes the table's exclusive lock, until the
migration commits (each migration commits on its own: ``migrations/env.py``).

The ranges are of an integer key (a rowid, a minute, a time in ms) between its minimum and maximum, each as wide as
holds ``BATCH_ROWS`` rows where the rows are spread evenly; a range never splits one key value, so on a table keyed
by minute a batch is at least a minute of samples.
"""

from __future__ import annotations

from typing import Final

from sqlalchemy.engine import Connection

from gpulens.storage.partitions import PARTITION_WIDTH_MS, existing_partitions

BATCH_ROWS: Final = 50_000  # rows copied per statement, about (a module attribute: the tests make it small)
NEW: Final = "_rebuild"  # the suffix of the new table, its partitions and indexes until the swap


def key_ranges(conn: Connection, source: str, key: str, batch_rows: int | None = None) -> list[tuple[int, int]]:
    """Half-open ranges ``[lo, hi)`` of ``key`` over ``source`` (a table, optionally with an alias), each of about
    ``batch_rows`` rows (``BATCH_ROWS``)."""
    lo, hi, count = conn.exec_driver_sql(f"SELECT min({key}), max({key}), count(*) FROM {source}").one()  # noqa: S608
    if lo is None or not count:
        return []
    lo, hi = int(lo), int(hi)
    rows = batch_rows or BATCH_ROWS
    width = max(1, (hi - lo + 1) * rows // int(count))
    return [(start, min(start + width, hi + 1)) for start in range(lo, hi + 1, width)]


def copy_batched(
    conn: Connection,
    *,
    into: str,
    names: str,
    select: str,
    source: str,
    key: str,
    order: str | None = None,
    join: str = "",
) -> int:
    """``INSERT INTO into (names) SELECT select FROM source join`` over ``key_ranges`` of ``key``, in ``order``
    (default: ``key``); returns the statements run."""
    ranges = key_ranges(conn, source, key)
    for lo, hi in ranges:
        conn.exec_driver_sql(
            f"INSERT INTO {into} ({names}) SELECT {select} FROM {source} {join} "  # noqa: S608
            f"WHERE {key} >= {lo} AND {key} < {hi} ORDER BY {order or key}"
        )
    return len(ranges)


def fill_partitioned(
    conn: Connection,
    table: str,
    *,
    definitions: str,
    indexes: tuple[str, ...] = (),
    names: str,
    select: str,
    join: str = "",
) -> None:
    """PostgreSQL: a new ``table`` + ``NEW`` partitioned by ``ts_ms`` (``definitions``: its columns and key;
    ``indexes``: the parent's ``CREATE INDEX`` statements as written for ``table``), a partition of the same bounds for
    each of the live table's, each filled from the live partition (aliased ``s``) in batches of ``ts_ms``."""
    new = f"{table}{NEW}"
    conn.exec_driver_sql(f"CREATE TABLE {new} ({definitions}) PARTITION BY RANGE (ts_ms)")
    for index in indexes:
        conn.exec_driver_sql(index.replace(table, new))
    width = PARTITION_WIDTH_MS[table]
    for name, start in sorted(existing_partitions(conn, table).items(), key=lambda item: item[1]):
        conn.exec_driver_sql(
            f'CREATE TABLE "{name}{NEW}" PARTITION OF {new} FOR VALUES FROM ({int(start)}) TO ({int(start + width)})'
        )
        copy_batched(conn, into=new, names=names, select=select, source=f'"{name}" AS s', key="s.ts_ms", join=join)


def swap_partitioned(conn: Connection, table: str) -> None:
    """PostgreSQL: drop the live ``table`` with its partitions, and give the new one (``fill_partitioned``), its
    partitions and their indexes the live names. Views that read ``table`` are dropped before."""
    new = f"{table}{NEW}"
    partitions = existing_partitions(conn, new)
    indexes = conn.exec_driver_sql(
        "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() AND tablename = ANY(%(tables)s)",
        {"tables": [new, *partitions]},
    ).all()
    conn.exec_driver_sql(f"DROP TABLE {table}")
    conn.exec_driver_sql(f"ALTER TABLE {new} RENAME TO {table}")
    for name in partitions:
        conn.exec_driver_sql(f'ALTER TABLE "{name}" RENAME TO "{name.removesuffix(NEW)}"')
    for (index,) in indexes:
        conn.exec_driver_sql(f'ALTER INDEX "{index}" RENAME TO "{str(index).replace(NEW, "", 1)}"')
