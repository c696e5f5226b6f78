"""The single write path: one transaction per scrape round, idempotent, batched.

Each GPU reading becomes one wide row of ``gpu_sample``: ``INSERT OR IGNORE`` executemany on SQLite; on PostgreSQL
``storage.pgsamples`` (binary ``COPY`` into a temporary table, then ``INSERT ... SELECT``, which the server runs while
the writer works out the round's job minutes and changes). Values travel in SI units and the SQL statement encodes
them (``StoredField.sql_encode``), which keeps the Python work per reading to one tuple.
The 15 seldom-changing fields go in ``gpu_profile``, once per distinct combination; a row names its profile (see
``gpulens.storage.profiles``).

RDMA ports, hosts and jobs' cgroups go in the same transaction (``storage.fabricwriter``), and so does the per-job
minute aggregate (``gpulens.storage.jobminute``). Jobs, processes and inactive NVLinks are written only when they change
(``storage.gpuchanges``). The writer keeps what it has stored per GPU in memory, compares each node's snapshot with
the node's previous one, and reloads its state from the database after any failure, so a failed transaction never
leaves memory and database apart.

A snapshot the database refuses (a value out of a column's range, an integrity error: readers drop such values at
the door, ``gpulens.storedrange``, so this is the last line) does not cost the round: the round is written again one
snapshot per transaction, the targets' health apart, and each snapshot that still fails is dropped, named in
``WriteStats.isolated`` and logged once per node.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from gpulens.logutil import LogOnce
from gpulens.model import GpuReading, JobInfo, NodeSnapshot, TargetHealth
from gpulens.storage import inspectorstore, jobminute, ncclstore, pgsamples, schema
from gpulens.storage.db import Database, lock_tier
from gpulens.storage.fabricwriter import FabricWriter, fabric_times
from gpulens.storage.gpuchanges import Changes, ChangeTracker, GpuState, Resolved, Static
from gpulens.storage.hardwarestore import HardwareWriter
from gpulens.storage.profiles import VALUES as PROFILE_VALUES
from gpulens.storage.profiles import Profiles
from gpulens.storage.rollup import PENDING
from gpulens.storage.slurmtables import write_job_info

log = logging.getLogger(__name__)

# What a snapshot's own values can cause (not the database's state): a round that fails so is written one snapshot
# at a time. sqlite3 raises OverflowError itself for an integer over 64 bits.
_SNAPSHOT_ERRORS: Final = (sa.exc.IntegrityError, sa.exc.DataError, OverflowError)

# gpu.last_seen_ms moves at most once a minute per GPU, not every scrape (see schema.newest_sample_ms).
LAST_SEEN_RESOLUTION_MS: Final = schema.MINUTE_MS

_MAX_JOB_INFO: Final = 10_000  # jobs whose written metadata the writer remembers (then it forgets them all)
# Every field of the row but xid_total (the last), derived from xid_errors, and the profile's (storage.profiles).
_ENCODED_FIELDS: Final = pgsamples.ENCODED_FIELDS
_READING_VALUES: Final[Callable[[GpuReading], tuple[Any, ...]]] = attrgetter(*(f.name for f in _ENCODED_FIELDS))
# The order of a row tuple: the reading's values first, so one tuple concatenation builds a row. The tuple holds SI
# values (PostgreSQL's staging table names its columns by field); gpu_sample's columns are named by stored unit.
_ROW_COLUMNS: Final = pgsamples.ROW_COLUMNS
_SAMPLE_COLUMNS: Final = pgsamples.SAMPLE_COLUMNS
_XID_TOTAL_LIMIT: Final = schema.FIELD_BY_NAME["xid_total"].limit

_static: Final[Callable[[GpuReading], Static]] = attrgetter(
    "node", "gpu", "model", "pci_bus_id", "driver_version", "mig_enabled"
)


def _sqlite_insert() -> str:
    """The row tuple's values; its ``ts_ms`` goes into the primary key's stored minute and millisecond."""
    encoded = [f.sql_encode(f"?{i}", "sqlite") for i, f in enumerate(_ENCODED_FIELDS, start=1)]
    rest = [f"?{i}" for i in range(len(_ENCODED_FIELDS) + 1, len(_ROW_COLUMNS) + 1)]
    columns, values = schema.sqlite_sample_insert([*_SAMPLE_COLUMNS.split(", ")], [*encoded, *rest])
    return f"INSERT OR IGNORE INTO gpu_sample ({', '.join(columns)}) VALUES ({', '.join(values)})"  # noqa: S608


_SQLITE_INSERT: Final = _sqlite_insert()


@dataclass
class WriteStats:
    """Rows written by one ``Writer.write`` call (rows already stored are not counted again)."""

    gpu_rows: int = 0
    process_rows: int = 0
    link_rows: int = 0
    job_rows: int = 0
    target_rows: int = 0
    nic_rows: int = 0
    host_rows: int = 0
    job_host_rows: int = 0
    job_minute_rows: int = 0  # (minute, job) rows of the per-job aggregate added to or computed again
    isolated: list[str] = field(default_factory=list)  # nodes whose snapshot the database refused: not stored

    def add(self, other: WriteStats) -> None:
        for f in fields(self):
            if f.name != "isolated":
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        self.isolated += other.isolated


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def _first_line(exc: BaseException) -> str:
    """The error's first line (a DBAPI error's message carries the statement and parameters after it)."""
    return (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [type(exc).__name__])[0]


def _pg_array(values: Iterable[int]) -> str:
    """Integers as a PostgreSQL array literal: 8,000 of them in a sixth of the time psycopg's list adapter
    takes (a Python loop per value; measured 2026-12-08)."""
    return "{" + ",".join(map(str, values)) + "}"


def _xid_columns(xids: Mapping[int, int]) -> tuple[int | None, str | None]:
    total = sum(xids.values())
    text = json.dumps({str(code): xids[code] for code in sorted(xids)}, separators=(",", ":"))
    return (total if 0 <= total <= _XID_TOTAL_LIMIT else None), text


class Writer:
    """Writes scrape rounds. One writer per process, used from one thread (the collector's write loop).

    A GPU is written by one collector at a time: shards split targets, so no two collectors share a GPU.
    """

    def __init__(self, db: Database) -> None:
        self._db = db
        self._gpus: dict[str, GpuState] | None = None
        self._profiles = Profiles(db.dialect)  # loaded with the GPUs
        self._tracker = ChangeTracker()  # what each round changes of the jobs, processes and links
        self._job_info: dict[str, JobInfo] = {}  # the scheduler's metadata as last written, by job id
        self._fabric = FabricWriter(db.dialect)
        self._hardware = HardwareWriter()  # each node's hardware, written when it changes
        self._job_minutes = True  # the store has the per-job aggregate (revision 0009); checked on each _load
        self._log_once = LogOnce(log)

    def write(self, snapshots: Sequence[NodeSnapshot], targets: Sequence[TargetHealth] = ()) -> WriteStats:
        """Store a scrape round in one transaction; when the database refuses it for a snapshot's values, one
        snapshot per transaction, the refused ones dropped (``WriteStats.isolated``). Raises
        ``DatabaseUnavailableError`` (then what was written is written again when the round is replayed)."""
        try:
            return self._write(snapshots, targets)
        except _SNAPSHOT_ERRORS:
            if not snapshots:
                raise
        stats = WriteStats()
        for snapshot in snapshots:
            try:
                stats.add(self._write([snapshot], ()))
            except _SNAPSHOT_ERRORS as exc:
                stats.isolated.append(snapshot.node)
                self._log_once(
                    f"isolated:{snapshot.node}",
                    "node %s: the database refused its snapshot (%s); the round's other snapshots are stored",
                    snapshot.node,
                    _first_line(exc),
                )
        stats.add(self._write((), targets))
        return stats

    def _write(self, snapshots: Sequence[NodeSnapshot], targets: Sequence[TargetHealth]) -> WriteStats:
        """One transaction."""
        readings = self._readings(snapshots)
        times = [round(reading.timestamp * 1000) for reading in readings]
        fabric = fabric_times(snapshots)
        stats = WriteStats()
        try:
            for table, ts in (("gpu_sample", times), *((f"{n}_sample", fabric) for n in ("nic", "host", "job_host"))):
                if ts:  # every day from the oldest reading to the newest
                    self._db.ensure_partitions(table, (*range(min(ts), max(ts), schema.DAY_MS), max(ts)))
            with self._db.write_transaction() as conn:
                gpus = self._gpus = self._gpus if self._gpus is not None else self._load(conn)
                lock_tier(conn, "1m", exclusive=False)
                resolved = self._resolve_gpus(conn, readings, times, gpus)
                # Without duplicates, the readings are the snapshots' own, in order: each node's slice is reused.
                unique = len(readings) == sum(len(s.gpus) for s in snapshots)
                with self._inserting(conn, resolved) as inserted:  # Python only in here: the server inserts meanwhile
                    added, late = (
                        jobminute.increments(snapshots, gpus, unique=unique) if self._job_minutes else ({}, set())
                    )
                    changes = self._tracker.changes(snapshots, gpus, resolved if unique else None)
                stats.gpu_rows = inserted.rows
                if times or fabric:
                    self._mark_late(conn, min(times + fabric))
                self._update_last_seen(conn, resolved)
                stats.job_minute_rows = jobminute.upsert(conn, self._db.dialect, added)
                stats.job_rows, stats.link_rows, stats.process_rows = self._write_changes(conn, changes)
                if late:  # readings written again or late: their minutes from the stored samples and allocations
                    stats.job_minute_rows += jobminute.recompute(conn, self._db.dialect, late)
                stats.target_rows = self._write_targets(conn, targets)
                stats.nic_rows, stats.host_rows, stats.job_host_rows = self._fabric.write(conn, snapshots)
                self._write_job_info(conn, snapshots)
                ncclstore.write(conn, snapshots)
                inspectorstore.write(conn, snapshots)
                self._hardware.write(conn, snapshots)
        except BaseException:
            # The state was updated as the round went; the commit may or may not have happened. Reload it.
            self.forget()
            raise
        return stats

    def forget(self) -> None:
        """Drop what the writer remembers of the store; the next write reloads it (after a failure, or when the
        other collector of an HA pair wrote meanwhile)."""
        self._job_info.clear()
        self._gpus = None
        self._profiles.reset()
        self._tracker.reset()
        self._fabric.reset()
        self._hardware.reset()

    def _write_job_info(self, conn: Connection, snapshots: Sequence[NodeSnapshot]) -> None:
        """The scheduler's metadata of the jobs whose metadata changed (or is new to this writer)."""
        changed = [i for s in snapshots for i in s.job_info if self._job_info.get(i.job_id) != i]
        if changed:
            if len(self._job_info) > _MAX_JOB_INFO:
                self._job_info.clear()
            write_job_info(conn, changed, max(s.timestamp for s in snapshots))
            self._job_info.update((i.job_id, i) for i in changed)

    # --- readings and static GPU info ---------------------------------------------------------------------------

    @staticmethod
    def _readings(snapshots: Sequence[NodeSnapshot]) -> list[GpuReading]:
        """Every reading once per (uuid, ms); a later duplicate in the round wins."""
        readings = [reading for snapshot in snapshots for reading in snapshot.gpus]
        if len({reading.uuid for reading in readings}) == len(readings):
            return readings
        unique = {(reading.uuid, _ms(reading.timestamp)): reading for reading in readings}
        return list(unique.values())

    def _load(self, conn: Connection) -> dict[str, GpuState]:
        self._job_minutes = sa.inspect(conn).has_table(jobminute.job_minute.name)  # not before revision 0009
        g = schema.gpu
        newest = schema.newest_sample_ms(self._db.dialect)
        columns = (g.c.id, g.c.uuid, g.c.node, g.c.gpu_index, g.c.model, g.c.pci_bus_id, g.c.driver_version)
        gpus: dict[str, GpuState] = {}
        by_id: dict[int, GpuState] = {}
        for row in conn.execute(sa.select(*columns, g.c.mig_enabled, g.c.last_seen_ms, newest.label("newest"))):
            static = (row.node, row.gpu_index, row.model, row.pci_bus_id, row.driver_version, row.mig_enabled)
            last_ms = row.newest if row.newest is not None else row.last_seen_ms
            gpus[row.uuid] = by_id[row.id] = GpuState(row.id, static, last_ms, row.last_seen_ms)
        a = schema.job_allocation
        for row in conn.execute(sa.select(a.c.gpu_id, a.c.job_id, a.c.user_name).where(a.c.end_ms.is_(None))):
            by_id[row.gpu_id].jobs[row.job_id] = row.user_name
        n = schema.nvlink_down
        for row in conn.execute(sa.select(n.c.gpu_id, n.c.link).where(n.c.end_ms.is_(None))):
            by_id[row.gpu_id].links_down.add(row.link)
        self._profiles.load(conn)
        return gpus

    def _resolve_gpus(
        self, conn: Connection, readings: Sequence[GpuReading], times: Sequence[int], gpus: dict[str, GpuState]
    ) -> list[Resolved]:
        """Each reading with its GPU's state and its time in ms; inserts new GPUs and updates changed static info."""
        resolved: list[Resolved] = []
        append = resolved.append
        for reading, ts_ms in zip(readings, times, strict=True):
            known = gpus.get(reading.uuid)
            static = _static(reading)
            if known is None or known.static != static:
                gpu_id, last_seen_ms = self._upsert_gpu(conn, reading.uuid, static, ts_ms)
                if known is None:
                    known = gpus[reading.uuid] = GpuState(gpu_id, static, -1, last_seen_ms)
                known.static = static
            append((reading, known, ts_ms))
        return resolved

    def _upsert_gpu(self, conn: Connection, uuid: str, static: Static, ts_ms: int) -> tuple[int, int]:
        """The GPU's id and stored last_seen_ms, inserting it or updating its static info."""
        names = ("node", "gpu_index", "model", "pci_bus_id", "driver_version", "mig_enabled")
        values = dict(zip(names, static, strict=True))
        dialect_insert = postgresql.insert if self._db.dialect == "postgresql" else sqlite.insert
        insert = dialect_insert(schema.gpu).values(uuid=uuid, first_seen_ms=ts_ms, last_seen_ms=ts_ms, **values)
        g = schema.gpu
        upsert = insert.on_conflict_do_update(index_elements=["uuid"], set_=values).returning(g.c.id, g.c.last_seen_ms)
        gpu_id, last_seen_ms = conn.execute(upsert).one()
        return int(gpu_id), int(last_seen_ms)

    # --- samples ------------------------------------------------------------------------------------------------

    def _sample_rows(self, conn: Connection, resolved: Sequence[Resolved]) -> list[tuple[Any, ...]]:
        """Each reading's row tuple (``pgsamples.ROW_COLUMNS``), naming its profile (added when new)."""
        rows: list[tuple[Any, ...]] = []
        append = rows.append
        for r, state, ts_ms in resolved:
            values = PROFILE_VALUES(r)
            last = state.profile
            if last is not None and last[0] == values:
                profile_id = last[1]
            else:
                profile_id = self._profiles.id_of(conn, values)
                state.profile = (values, profile_id)
            tail = (state.id, ts_ms, profile_id, *_xid_columns(r.xid_errors)) if r.xid_errors else None
            append(_READING_VALUES(r) + (tail or (state.id, ts_ms, profile_id, 0, None)))
        return rows

    def _inserting(self, conn: Connection, resolved: Sequence[Resolved]) -> AbstractContextManager[pgsamples.Inserted]:
        """Insert the round's sample rows; on PostgreSQL the server inserts them while the block runs (the block must
        not use ``conn``). The rows inserted are the context's ``rows`` once it is left."""
        rows = self._sample_rows(conn, resolved) if resolved else []
        if not rows:
            return nullcontext(pgsamples.Inserted())
        if self._db.dialect == "sqlite":
            return nullcontext(pgsamples.Inserted(int(conn.exec_driver_sql(_SQLITE_INSERT, rows).rowcount)))
        pgsamples.stage(conn, rows)
        return pgsamples.PendingInsert(conn)

    @staticmethod
    def _mark_late(conn: Connection, earliest: int) -> None:
        """Samples older than the 1-minute rollup position make the rollup recompute their buckets."""
        t = schema.tier_state
        # A bucket being rolled up slice by slice counts as rolled up already (see gpulens.storage.rollup.PENDING).
        position = conn.execute(
            sa.select(sa.func.max(t.c.position_ms)).where(t.c.tier.in_(["1m", "1m" + PENDING]))
        ).scalar_one_or_none()
        if position is not None and earliest < position:
            conn.execute(sa.insert(schema.rollup_dirty).values(tier="1m", from_ms=earliest))

    def _update_last_seen(self, conn: Connection, resolved: Sequence[Resolved]) -> None:
        due: dict[int, int] = {}
        for _, state, ts_ms in resolved:
            if ts_ms - state.stored_last_seen_ms >= LAST_SEEN_RESOLUTION_MS:
                state.stored_last_seen_ms = ts_ms
                due[state.id] = ts_ms
        if not due:
            return
        if self._db.dialect == "postgresql":
            conn.exec_driver_sql(
                "UPDATE gpu SET last_seen_ms = v.ts FROM "
                "(SELECT unnest(%(ids)s::integer[]) AS id, unnest(%(ts)s::bigint[]) AS ts) AS v "
                "WHERE gpu.id = v.id AND gpu.last_seen_ms < v.ts",
                {"ids": _pg_array(due), "ts": _pg_array(due.values())},
            )
        else:
            conn.exec_driver_sql(
                "UPDATE gpu SET last_seen_ms = ? WHERE id = ? AND last_seen_ms < ?",
                [(ts, gpu_id, ts) for gpu_id, ts in due.items()],
            )

    def _write_changes(self, conn: Connection, changes: Changes) -> tuple[int, int, int]:
        """Close, then insert, job allocations and link outages; replace the processes of GPUs whose set changed."""
        a, n, p = schema.job_allocation, schema.nvlink_down, schema.process_latest
        jobs = self._close_and_open(
            conn, a, a.c.job_id, changes.closed_jobs, [*changes.finished_jobs, *changes.opened_jobs.values()]
        )
        links = self._close_and_open(
            conn, n, n.c.link, changes.closed_links, [*changes.finished_links, *changes.opened_links.values()]
        )
        if changes.process_gpus:
            conn.execute(
                sa.delete(p).where(p.c.gpu_id == sa.bindparam("b_gpu")), [{"b_gpu": g} for g in changes.process_gpus]
            )
        if changes.process_rows:
            conn.execute(sa.insert(p), changes.process_rows)
        return jobs, links, len(changes.process_rows)

    def _close_and_open(
        self,
        conn: Connection,
        table: sa.Table,
        key: sa.Column[Any],
        closed: list[dict[str, Any]],
        opened: list[dict[str, Any]],
    ) -> int:
        if closed:
            conn.execute(
                sa.update(table)
                .where(table.c.gpu_id == sa.bindparam("b_gpu"), key == sa.bindparam("b_key"), table.c.end_ms.is_(None))
                .values(end_ms=sa.bindparam("b_end")),
                closed,
            )
        if opened:
            dialect_insert = postgresql.insert if self._db.dialect == "postgresql" else sqlite.insert
            conn.execute(dialect_insert(table).on_conflict_do_nothing(), opened)
        return len(closed) + len(opened)

    # --- targets ------------------------------------------------------------------------------------------------

    def _write_targets(self, conn: Connection, targets: Sequence[TargetHealth]) -> int:
        """Upsert the latest health of each target (an older report never overwrites a newer one)."""
        if not targets:
            return 0
        latest: dict[str, TargetHealth] = {}
        for target in sorted(targets, key=attrgetter("timestamp")):
            latest[target.target] = target
        rows = [
            {
                "target": t.target,
                "url": t.url,
                "kind": t.kind,
                "node": t.node,
                "up": t.up,
                "at": t.timestamp,
                "scrape_duration_seconds": t.scrape_duration_seconds,
                "samples": t.samples,
                "rejected": t.rejected,
                "last_error": t.last_error,
            }
            for t in latest.values()
        ]
        table = schema.target_health
        dialect_insert = postgresql.insert if self._db.dialect == "postgresql" else sqlite.insert
        stmt = dialect_insert(table)
        stmt = stmt.on_conflict_do_update(
            index_elements=["target"],
            set_={c.name: stmt.excluded[c.name] for c in table.columns if c.name != "target"},
            where=table.c.at <= stmt.excluded.at,
        )
        conn.execute(stmt, rows)
        return len(rows)
