"""The fabric and host part of a scrape round's write: port, host and job-host rows, in the GPU rows' transaction.

``gpulens.storage.writer.Writer`` calls ``FabricWriter.write`` inside its transaction. Each ``NicReading``,
``HostReading`` and ``JobHostReading`` of a snapshot becomes one row of ``nic_sample``, ``host_sample`` or
``job_host_sample`` at the snapshot's time, written like the GPU rows: values travel in SI units and the SQL
statement encodes them (``StoredField.sql_encode``); ``INSERT OR IGNORE`` on SQLite, binary ``COPY`` into a staging
table then ``INSERT ... SELECT`` on PostgreSQL. The dimension rows (``nic``, ``host``, ``job_host``) are upserted when
their static part changes and their ``last_seen_ms`` moves at most once a minute (see ``schema.newest_sample_ms``).
The state kept in memory is dropped by the caller after any failure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from gpulens.fabricmodel import HostReading, JobHostReading, NicReading
from gpulens.model import NodeSnapshot
from gpulens.storage import fabricschema, schema
from gpulens.storage.fabricschema import HOST, JOB_HOST, NIC, NIC_CODES, Family


@dataclass(slots=True)
class _Dimension:
    id: int
    static: tuple[Any, ...]
    stored_last_seen_ms: int


class _Rows:
    """The insert statements of one family: the row tuple is (SI field values..., raw-only values..., key, ts_ms)."""

    def __init__(self, family: Family, dialect: str) -> None:
        self.family = family
        self.dialect = dialect
        fields = family.fields
        names = [*(f.name for f in fields), *family.raw_columns, family.key, "ts_ms"]
        columns = ", ".join([*(f.column for f in fields), *family.raw_columns, family.key, "ts_ms"])
        self.stage = f"gpulens_{family.name}_in"
        if dialect == "sqlite":
            encoded = [f.sql_encode(f"?{i}", "sqlite") for i, f in enumerate(fields, start=1)]
            rest = [f"?{i}" for i in range(len(fields) + 1, len(names) + 1)]
            stored, placed = schema.sqlite_sample_insert(columns.split(", "), [*encoded, *rest])  # ts_ms: minute, ms
            self.sql = f"INSERT OR IGNORE INTO {family.sample} ({', '.join(stored)}) VALUES ({', '.join(placed)})"  # noqa: S608
            return
        self.types = (
            *("boolean" if f.is_bool else "numeric" if f.is_int else "double precision" for f in fields),
            *("smallint" for _ in family.raw_columns),
            *("integer", "bigint"),
        )
        staged = ", ".join(f"{n} {t}" for n, t in zip(names, self.types, strict=True))
        self.ddl = f"CREATE TEMP TABLE IF NOT EXISTS {self.stage} ({staged}) ON COMMIT DELETE ROWS"
        values = ", ".join([*(f.sql_encode(f.name, "postgresql") for f in fields), *names[len(fields) :]])
        self.sql = f"INSERT INTO {family.sample} ({columns}) SELECT {values} FROM {self.stage}"  # noqa: S608
        self.copy = f"COPY {self.stage} ({', '.join(names)}) FROM STDIN (FORMAT BINARY)"

    def insert(self, conn: Connection, rows: Sequence[tuple[Any, ...]]) -> int:
        if not rows:
            return 0
        if self.dialect == "sqlite":
            return int(conn.exec_driver_sql(self.sql, rows).rowcount)
        conn.exec_driver_sql(self.ddl)
        with conn.connection.driver_connection.cursor() as cursor, cursor.copy(self.copy) as copy:  # type: ignore[union-attr]
            copy.set_types(self.types)
            for row in rows:
                copy.write_row(row)
        try:
            with conn.begin_nested():
                return int(conn.exec_driver_sql(self.sql).rowcount)
        except sa.exc.IntegrityError:  # a round written again (a replayed spool): skip what is stored
            return int(conn.exec_driver_sql(self.sql + " ON CONFLICT DO NOTHING").rowcount)


def _getter(family: Family) -> Callable[[Any], tuple[Any, ...]]:
    """A record's stored field values as one tuple, in column order (C-level: a round has thousands of ports)."""
    return attrgetter(*(f.name for f in family.fields))


_NIC_VALUES: Final = _getter(NIC)
_HOST_VALUES: Final = _getter(HOST)
_JOB_VALUES: Final = _getter(JOB_HOST)
_NIC_NAMES: Final[Callable[[NicReading], tuple[str | None, ...]]] = attrgetter(*(a for a, _, _ in NIC_CODES))
_NIC_STATIC: Final = attrgetter("link_layer", "pci_bus_id", "numa_node", "gpus")


def _nic_codes(names: tuple[str | None, ...]) -> tuple[int | None, ...]:
    return tuple(fabricschema.encode_code(known, name) for (_, _, known), name in zip(NIC_CODES, names, strict=True))


def fabric_times(snapshots: Sequence[NodeSnapshot]) -> list[int]:
    """The times of the snapshots that have port, host or job-host rows."""
    return [round(s.timestamp * 1000) for s in snapshots if s.nics or s.host is not None or s.job_hosts]


class FabricWriter:
    """Writes the ports, hosts and job hosts of scrape rounds; one per ``Writer``."""

    def __init__(self, dialect: str) -> None:
        self._dialect = dialect
        self._rows = {f.name: _Rows(f, dialect) for f in (NIC, HOST, JOB_HOST)}
        self._dims: dict[str, dict[tuple[Any, ...], _Dimension]] | None = None
        self._codes: dict[tuple[str | None, ...], tuple[int | None, ...]] = {}  # port state names -> their codes

    def reset(self) -> None:
        """Forget what is stored (after a failed transaction): reloaded on the next write."""
        self._dims = None

    def write(self, conn: Connection, snapshots: Sequence[NodeSnapshot]) -> tuple[int, int, int]:
        """Insert the rounds' port, host and job-host rows; returns the rows written of each."""
        if not any(s.nics or s.host is not None or s.job_hosts for s in snapshots):
            return 0, 0, 0
        dims = self._dims = self._dims if self._dims is not None else self._load(conn)
        rows: dict[str, dict[tuple[int, int], tuple[Any, ...]]] = {"nic": {}, "host": {}, "job_host": {}}
        due: dict[str, dict[int, int]] = {"nic": {}, "host": {}, "job_host": {}}
        nic_dims, nic_rows, codes = dims["nic"], rows["nic"], self._codes
        for s in sorted(snapshots, key=lambda s: s.timestamp):  # a later duplicate of (key, ms) wins
            ts = round(s.timestamp * 1000)
            for n in s.nics:
                static = _NIC_STATIC(n)
                d = nic_dims.get(n.key)
                if d is None or d.static != static:
                    d = self._dimension(conn, dims, "nic", n.key, static, ts)
                names = _NIC_NAMES(n)
                code = codes.get(names)
                if code is None:
                    code = codes[names] = _nic_codes(names)
                nic_rows[(d.id, ts)] = (*_NIC_VALUES(n), *code, d.id, ts)
                if ts - d.stored_last_seen_ms >= schema.MINUTE_MS:
                    self._seen(due["nic"], d, ts)
            if s.host is not None:
                h: HostReading = s.host
                d = self._dimension(conn, dims, "host", (h.node,), (h.cpus,), ts)
                rows["host"][(d.id, ts)] = (*_HOST_VALUES(h), d.id, ts)
                self._seen(due["host"], d, ts)
            for j in s.job_hosts:
                jh: JobHostReading = j
                d = self._dimension(conn, dims, "job_host", (jh.node, jh.job_id), (jh.cgroup, jh.cgroup_version), ts)
                rows["job_host"][(d.id, ts)] = (*_JOB_VALUES(jh), d.id, ts)
                self._seen(due["job_host"], d, ts)
        written = tuple(
            self._rows[name].insert(conn, list(rows[name].values())) for name in ("nic", "host", "job_host")
        )
        for name, ids in due.items():
            self._update_last_seen(conn, name, ids)
        return written[0], written[1], written[2]

    @staticmethod
    def _seen(due: dict[int, int], d: _Dimension, ts: int) -> None:
        if ts - d.stored_last_seen_ms >= schema.MINUTE_MS:
            d.stored_last_seen_ms = ts
            due[d.id] = max(ts, due.get(d.id, ts))

    _KEYS: Final = {"nic": ("node", "device", "port"), "host": ("node",), "job_host": ("node", "job_id")}
    _STATIC: Final = {
        "nic": ("link_layer", "pci_bus_id", "numa_node", "gpus"),
        "host": ("cpus",),
        "job_host": ("cgroup", "cgroup_version"),
    }

    def _load(self, conn: Connection) -> dict[str, dict[tuple[Any, ...], _Dimension]]:
        out: dict[str, dict[tuple[Any, ...], _Dimension]] = {}
        for name, keys in self._KEYS.items():
            table = schema.metadata.tables[name]
            static = self._STATIC[name]
            columns = [table.c[c] for c in (*keys, *static, "id", "last_seen_ms")]
            out[name] = {
                tuple(row[: len(keys)]): _Dimension(
                    row.id, self._static_of(name, tuple(row[len(keys) : len(keys) + len(static)])), row.last_seen_ms
                )
                for row in conn.execute(sa.select(*columns))
            }
        return out

    @staticmethod
    def _static_of(name: str, stored: tuple[Any, ...]) -> tuple[Any, ...]:
        """A dimension row's static columns as the writer compares them (a port's GPUs as a tuple of indices)."""
        if name != "nic":
            return stored
        *rest, gpus = stored
        return (*rest, tuple(int(g) for g in gpus.split(",") if g) if gpus else ())

    def _dimension(
        self,
        conn: Connection,
        dims: dict[str, dict[tuple[Any, ...], _Dimension]],
        name: str,
        key: tuple[Any, ...],
        static: tuple[Any, ...],
        ts: int,
    ) -> _Dimension:
        known = dims[name].get(key)
        if known is not None and known.static == static:
            return known
        table = schema.metadata.tables[name]
        values = dict(zip(self._STATIC[name], static, strict=True))
        if name == "nic":  # the GPU indices as text: "4,5"
            values["gpus"] = ",".join(map(str, values["gpus"]))
        insert = (postgresql.insert if self._dialect == "postgresql" else sqlite.insert)(table).values(
            **dict(zip(self._KEYS[name], key, strict=True)), **values, first_seen_ms=ts, last_seen_ms=ts
        )
        upsert = insert.on_conflict_do_update(index_elements=list(self._KEYS[name]), set_=values).returning(
            table.c.id, table.c.last_seen_ms
        )
        row_id, last_seen_ms = conn.execute(upsert).one()
        if known is None:
            known = dims[name][key] = _Dimension(int(row_id), static, int(last_seen_ms))
        known.static = static
        return known

    def _update_last_seen(self, conn: Connection, name: str, due: dict[int, int]) -> None:
        if not due:
            return
        if self._dialect == "postgresql":
            conn.exec_driver_sql(
                f"UPDATE {name} SET last_seen_ms = v.ts FROM "  # noqa: S608 (a constant table name)
                "(SELECT unnest(%(ids)s::integer[]) AS id, unnest(%(ts)s::bigint[]) AS ts) AS v "
                f"WHERE {name}.id = v.id AND {name}.last_seen_ms < v.ts",
                {"ids": list(due), "ts": list(due.values())},
            )
        else:
            conn.exec_driver_sql(
                f"UPDATE {name} SET last_seen_ms = ? WHERE id = ? AND last_seen_ms < ?",  # noqa: S608
                [(ts, row_id, ts) for row_id, ts in due.items()],
            )
