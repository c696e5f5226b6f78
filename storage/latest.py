"""The cluster now: the newest reading of every GPU, the jobs and processes on each, and a cluster summary.

The newest sample of a GPU lies within a minute of ``gpu.last_seen_ms`` (see ``schema.newest_sample_ms``), so each is
found with one bounded index seek. Readings come back as ``gpulens.model`` records in SI units.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import sqlalchemy as sa

from gpulens.model import GpuJob, GpuReading, ProcessReading
from gpulens.storage import schema
from gpulens.storage.db import Database
from gpulens.storage.records import IDLE_UTILIZATION

KNOWN_WITHIN_S: Final = 7 * 86_400.0  # cluster_summary counts GPUs seen this recently as part of the cluster
# What every reading read carries, whatever fields are asked for: the GPU's identity, its time and whether it is up.
ALWAYS_READ: Final = frozenset(
    ("node", "gpu", "uuid", "model", "timestamp", "up", "pci_bus_id", "driver_version", "mig_enabled")
)
_LAST_SEEN_MINUTE: Final = schema.minute_of("g.last_seen_ms")  # SQLite: the stored minute of a GPU's last_seen_ms
_READING_FIELDS: Final = frozenset(f.name for f in dataclasses.fields(GpuReading))
_NEW: Final = object.__new__
_SLOTS: Final = tuple(vars(GpuReading)[f.name].__set__ for f in dataclasses.fields(GpuReading))  # in field order


@dataclass(frozen=True, slots=True)
class ClusterSummary:
    timestamp: float
    gpus_total: int  # seen within the last week
    gpus_reporting: int  # with a reading newer than max_age_s
    gpus_up: int
    gpus_busy: int
    gpus_idle: int
    gpus_allocated_idle: int  # idle while a job holds them
    utilization_ratio_mean: float | None
    memory_used_bytes: int
    memory_total_bytes: int
    power_watts: float
    nodes_total: int
    nodes_reporting: int


def reading_columns(dialect: str, fields: frozenset[str] | None = None) -> tuple[str, list[int], int]:
    """The SELECT list of a GpuReading in field order, decoded to SI units by the database.

    Returns the list, the positions of boolean fields (the database returns 0/1) and of the XID JSON. The query
    names the sample ``s``, its GPU ``g`` and the sample's profile (``gpu_profile``) ``p``. With ``fields``, a field
    neither in it nor in ``ALWAYS_READ`` is selected as NULL: left unknown and not read.
    """
    static = {
        "node": "g.node",
        "gpu": "g.gpu_index",
        "uuid": "g.uuid",
        "model": "g.model",
        "timestamp": f"CAST(s.ts_ms AS {'DOUBLE PRECISION' if dialect == 'postgresql' else 'REAL'}) / 1000",
        "pci_bus_id": "g.pci_bus_id",
        "driver_version": "g.driver_version",
        "mig_enabled": "g.mig_enabled",
        "xid_errors": "s.xid_errors",
    }
    columns: list[str] = []
    booleans: list[int] = []
    for i, f in enumerate(dataclasses.fields(GpuReading)):
        stored = schema.FIELD_BY_NAME.get(f.name)
        if fields is not None and f.name not in fields and f.name not in ALWAYS_READ:
            columns.append("NULL")
        elif stored is None:
            columns.append(static[f.name])
        else:
            alias = "p" if stored.profile else "s"
            columns.append(stored.sql_decode(f"{alias}.{stored.column}", dialect))
        if str(f.type) in ("bool", "bool | None"):
            booleans.append(i)
    return ", ".join(columns), booleans, len(columns) - 1


@functools.cache
def _latest_sql(
    dialect: str, max_age: bool, node: bool = False, uuids: bool = False, fields: frozenset[str] | None = None
) -> str:
    columns = reading_columns(dialect, fields)[0]
    conditions = ["g.last_seen_ms >= :cutoff - 60000"] if max_age else []
    conditions += ["g.node = :node"] if node else []
    conditions += ["g.uuid IN :uuids"] if uuids else []
    fresh = ("WHERE " + " AND ".join(conditions)) if conditions else ""
    if dialect == "postgresql":
        return (
            f"SELECT {columns} FROM gpu AS g CROSS JOIN LATERAL "  # noqa: S608 (constant identifiers)
            "(SELECT * FROM gpu_sample AS x WHERE x.gpu_id = g.id AND x.ts_ms >= g.last_seen_ms "
            f"AND x.ts_ms < g.last_seen_ms + 60000 ORDER BY x.ts_ms DESC LIMIT 1) AS s "
            f"JOIN gpu_profile AS p ON p.profile_id = s.profile_id {fresh}"
        )
    return (
        # MATERIALIZED and CROSS JOIN keep SQLite's plan: one primary-key seek per GPU, then one row fetch. The
        # newest sample is the first along the key backwards (ts_ms, generated, is computed for that row alone).
        "WITH latest AS MATERIALIZED (SELECT g.id AS gpu_id, (SELECT x.ts_ms FROM gpu_sample AS x "  # noqa: S608
        f"WHERE x.gpu_id = g.id AND x.minute IN ({_LAST_SEEN_MINUTE}, {_LAST_SEEN_MINUTE} + 1) "
        "AND x.ts_ms >= g.last_seen_ms ORDER BY x.minute DESC, x.ms DESC LIMIT 1) AS ts_ms "
        f"FROM gpu AS g {fresh}) "
        f"SELECT {columns} FROM latest AS l CROSS JOIN gpu AS g CROSS JOIN gpu_sample AS s CROSS JOIN gpu_profile AS p "
        f"WHERE g.id = l.gpu_id AND s.minute = {schema.minute_of('l.ts_ms')} AND s.gpu_id = l.gpu_id "
        f"AND s.ms = {schema.ms_of('l.ts_ms')} AND p.profile_id = s.profile_id"
    )


def reading_from_row(row: Sequence[Any], booleans: Sequence[int], xids: int) -> GpuReading:
    """A row of ``reading_columns`` (every field, in order) as a GpuReading, its slots filled directly: the frozen
    class's ``__init__`` sets each of its fields through ``object.__setattr__``, at twice the cost (a page reading
    8,000 GPUs spent a third of its read there)."""
    values = list(row)
    for i in booleans:
        if values[i] is not None:
            values[i] = bool(values[i])
    text = values[xids]
    values[xids] = {int(k): int(v) for k, v in json.loads(text).items()} if text else {}
    reading = _NEW(GpuReading)
    for put, value in zip(_SLOTS, values, strict=True):
        put(reading, value)
    return reading


def latest_readings(
    db: Database,
    *,
    max_age_s: float | None = None,
    node: str | None = None,
    uuids: Sequence[str] | None = None,
    fields: Sequence[str] | None = None,
) -> list[GpuReading]:
    """The newest reading of every GPU (only those newer than ``max_age_s``, of ``node``, of ``uuids``, if given),
    by node and index. ``fields``: read only these besides ``ALWAYS_READ`` (the others are ``None``); an unknown
    name raises ``ValueError``."""
    wanted = None if fields is None else frozenset(fields)
    if wanted is not None and not wanted <= _READING_FIELDS:
        raise ValueError(f"unknown reading fields: {', '.join(sorted(wanted - _READING_FIELDS))}")
    params: dict[str, Any] = {"cutoff": round((db.clock.now() - max_age_s) * 1000)} if max_age_s is not None else {}
    if node is not None:
        params["node"] = node
    if uuids is not None:
        if not uuids:
            return []
        params["uuids"] = list(uuids)
    _, booleans, xids = reading_columns(db.dialect)
    sql = sa.text(_latest_sql(db.dialect, max_age_s is not None, node is not None, uuids is not None, wanted))
    if uuids is not None:
        sql = sql.bindparams(sa.bindparam("uuids", expanding=True))
    with db.session() as session:
        rows = session.execute(sql, params).all()
    readings = [reading_from_row(row, booleans, xids) for row in rows]
    if max_age_s is not None:
        cutoff = db.clock.now() - max_age_s
        readings = [r for r in readings if r.timestamp >= cutoff]
    return sorted(readings, key=lambda r: (r.node, r.gpu))


def current_jobs(db: Database, *, node: str | None = None) -> list[GpuJob]:
    """The jobs holding each GPU now (of ``node``'s GPUs only), by node, index and job."""
    a, g = schema.job_allocation, schema.gpu
    on_node = g.c.node == node if node is not None else sa.true()
    with db.session() as session:
        rows = session.execute(
            sa.select(g.c.node, g.c.gpu_index, g.c.uuid, a.c.job_id, a.c.user_name)
            .join(a, a.c.gpu_id == g.c.id)
            .where(a.c.end_ms.is_(None), on_node)
            .order_by(g.c.node, g.c.gpu_index, a.c.job_id)
        ).all()
    return [GpuJob(*row) for row in rows]


def current_processes(db: Database, *, node: str | None = None) -> list[ProcessReading]:
    """The processes of each GPU's latest reading (of ``node``'s GPUs only), by node, index and pid."""
    g, p = schema.gpu, schema.process_latest
    on_node = g.c.node == node if node is not None else sa.true()
    with db.session() as session:
        rows = session.execute(
            sa.select(g.c.node, g.c.gpu_index, g.c.uuid, p.c.pid, p.c.memory_used_bytes, p.c.command)
            .add_columns(p.c.user_name, p.c.job_id)
            .join(p, p.c.gpu_id == g.c.id)
            .where(on_node)
            .order_by(g.c.node, g.c.gpu_index, p.c.pid)
        ).all()
    return [ProcessReading(*row) for row in rows]


def latest_snapshot_parts(db: Database, *, node: str | None = None) -> tuple[list[GpuJob], list[ProcessReading]]:
    """The jobs holding each GPU now and the processes of each GPU's latest reading (of ``node``'s GPUs only)."""
    return current_jobs(db, node=node), current_processes(db, node=node)


def cluster_summary(db: Database, *, max_age_s: float, known_within_s: float = KNOWN_WITHIN_S) -> ClusterSummary:
    """The cluster now: GPUs reporting, up, busy, idle and idle while allocated; utilization, memory, power."""
    now = db.clock.now()
    g, a = schema.gpu, schema.job_allocation
    with db.session() as session:
        known = session.execute(
            sa.select(g.c.uuid, g.c.node).where(g.c.last_seen_ms >= round((now - known_within_s) * 1000))
        ).all()
        allocated = set(
            session.execute(
                sa.select(g.c.uuid).join(a, a.c.gpu_id == g.c.id).where(a.c.end_ms.is_(None)).distinct()
            ).scalars()
        )
    readings = latest_readings(db, max_age_s=max_age_s)
    up = [r for r in readings if r.up]
    utilizations = [r.utilization_ratio for r in up if r.utilization_ratio is not None]
    idle = [r for r in up if r.utilization_ratio is not None and r.utilization_ratio < IDLE_UTILIZATION]
    return ClusterSummary(
        timestamp=now,
        gpus_total=len({row.uuid for row in known} | {r.uuid for r in readings}),
        gpus_reporting=len(readings),
        gpus_up=len(up),
        gpus_busy=len(utilizations) - len(idle),
        gpus_idle=len(idle),
        gpus_allocated_idle=sum(1 for r in idle if r.uuid in allocated),
        utilization_ratio_mean=sum(utilizations) / len(utilizations) if utilizations else None,
        memory_used_bytes=sum(r.memory_used_bytes or 0 for r in up),
        memory_total_bytes=sum(r.memory_total_bytes or 0 for r in up),
        power_watts=sum(r.power_watts or 0.0 for r in readings),
        nodes_total=len({row.node for row in known} | {r.node for r in readings}),
        nodes_reporting=len({r.node for r in readings}),
    )
