"""Reads of the fabric and host rows: the newest row of every port, host and job host, and their time series.

The newest sample of a dimension row (a port, a node, a job on a node) lies within a minute of its ``last_seen_ms``
(the writer keeps it so, as for GPUs: ``schema.newest_sample_ms``), so each is found with one bounded index seek, and
a read of one node's ports touches only that node's rows. Series go through ``timeseries.family_series``: the same
tier plan and aggregates as the GPU series. Everything comes back in SI units as ``gpulens.fabricmodel`` records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import sqlalchemy as sa

from gpulens.fabricmodel import HostReading, JobHostReading, NicReading, nic_id, parse_nic_id
from gpulens.storage import fabricschema, schema, timeseries
from gpulens.storage.db import Database
from gpulens.storage.fabricschema import HOST, JOB_HOST, NIC, Family
from gpulens.storage.records import SeriesData, check_nic_fields
from gpulens.storage.schema import StoredField

_LAST_SEEN_MINUTE: Final = schema.minute_of("d.last_seen_ms")  # SQLite: the stored minute of a row's last_seen_ms
_STATIC: Final = {
    "nic": ("node", "device", "port", "link_layer", "pci_bus_id", "numa_node", "gpus"),
    "host": ("node", "cpus"),
    "job_host": ("node", "job_id", "cgroup", "cgroup_version"),
}
_CONDITIONS: Final = {
    "node": "d.node = :node",
    "nodes": "d.node IN :nodes",
    "job_id": "d.job_id = :job_id",
    "cutoff": "d.last_seen_ms >= :cutoff",
}


def _columns(family: Family, dialect: str) -> list[str]:
    real = "DOUBLE PRECISION" if dialect == "postgresql" else "REAL"
    columns = [f"d.{c}" for c in _STATIC[family.name]]
    columns.append(f"CAST(s.ts_ms AS {real}) / 1000")
    columns += [f.sql_decode(f"s.{f.column}", dialect) for f in family.fields]
    columns += [f"s.{c}" for c in family.raw_columns]
    return columns


def latest_sql(family: Family, dialect: str, conditions: Sequence[str]) -> str:
    """The newest sample of each dimension row that meets ``conditions`` (keys of ``_CONDITIONS``), decoded."""
    columns = ", ".join(_columns(family, dialect))
    where = ("WHERE " + " AND ".join(_CONDITIONS[c] for c in conditions)) if conditions else ""
    key, dimension, sample = family.key, family.dimension, family.sample
    if dialect == "postgresql":
        return (
            f"SELECT {columns} FROM {dimension} AS d CROSS JOIN LATERAL "  # noqa: S608 (constant identifiers)
            f"(SELECT * FROM {sample} AS x WHERE x.{key} = d.id AND x.ts_ms >= d.last_seen_ms "
            f"AND x.ts_ms < d.last_seen_ms + 60000 ORDER BY x.ts_ms DESC LIMIT 1) AS s {where}"
        )
    return (
        # MATERIALIZED and CROSS JOIN keep SQLite's plan: one primary-key seek per row, then one row fetch.
        # The newest sample is the first along the key backwards (ts_ms, generated, is computed for that row alone).
        f"WITH latest AS MATERIALIZED (SELECT d.id AS rid, (SELECT x.ts_ms FROM {sample} AS x "  # noqa: S608
        f"WHERE x.{key} = d.id AND x.minute IN ({_LAST_SEEN_MINUTE}, {_LAST_SEEN_MINUTE} + 1) "
        "AND x.ts_ms >= d.last_seen_ms ORDER BY x.minute DESC, x.ms DESC LIMIT 1) AS ts_ms "
        f"FROM {dimension} AS d {where}) "
        f"SELECT {columns} FROM latest AS l CROSS JOIN {dimension} AS d CROSS JOIN {sample} AS s "
        f"WHERE d.id = l.rid AND s.minute = {schema.minute_of('l.ts_ms')} AND s.{key} = l.rid "
        f"AND s.ms = {schema.ms_of('l.ts_ms')}"
    )


def _latest(db: Database, family: Family, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Each row as a dict of record fields (and ``timestamp``)."""
    statement = sa.text(latest_sql(family, db.dialect, list(params)))
    if "nodes" in params:
        statement = statement.bindparams(sa.bindparam("nodes", expanding=True))
    with db.session() as session:
        rows = session.execute(statement, params).all()
    names = [*_STATIC[family.name], "timestamp", *(f.name for f in family.fields), *family.raw_columns]
    out = []
    for row in rows:
        record = dict(zip(names, row, strict=True))
        for f in family.fields:
            value = record[f.name]
            if value is not None:
                record[f.name] = bool(value) if f.is_bool else int(value) if f.is_int else float(value)
        out.append(record)
    return out


def _natural(name: str) -> tuple[str, int]:
    """``mlx5_2`` before ``mlx5_10``."""
    stem = name.rstrip("0123456789")
    return (stem, int(name[len(stem) :]) if len(stem) < len(name) else -1)


def latest_nics(
    db: Database,
    *,
    node: str | None = None,
    max_age_s: float | None = None,
    fields: Sequence[str] | None = None,
    nodes: Sequence[str] | None = None,
) -> list[NicReading]:
    """The newest reading of every port (of ``node`` / ``nodes``, newer than ``max_age_s``, if given), by node,
    device, port.

    ``fields`` (the fields a caller needs) is checked, and every field read: one row holds them all."""
    check_nic_fields(fields)
    if nodes is not None and not nodes:
        return []
    params: dict[str, Any] = {} if node is None else {"node": node}
    if nodes is not None:
        params["nodes"] = sorted(set(nodes))
    cutoff = None if max_age_s is None else db.clock.now() - max_age_s
    if cutoff is not None:
        params["cutoff"] = round(cutoff * 1000) - 60_000  # the newest sample may be up to a minute past last_seen
    out = []
    for record in _latest(db, NIC, params):
        if cutoff is not None and record["timestamp"] < cutoff:
            continue
        del record["timestamp"]
        for attribute, column, names in fabricschema.NIC_CODES:
            record[attribute] = fabricschema.decode_code(names, record.pop(column))
        gpus = record.pop("gpus")
        record["up"] = bool(record["up"])
        out.append(NicReading(**record, gpus=tuple(int(g) for g in gpus.split(",") if g) if gpus else ()))
    return sorted(out, key=lambda n: (n.node, _natural(n.device), n.port))


def nic_counts(db: Database) -> dict[str, tuple[int, int]]:
    """Per node, its ports now: (up, all), counted from every port's newest reading."""
    out: dict[str, tuple[int, int]] = {}
    for n in latest_nics(db):
        up, total = out.get(n.node, (0, 0))
        out[n.node] = (up + int(n.up), total + 1)
    return out


def latest_hosts(db: Database, *, node: str | None = None) -> list[HostReading]:
    """The newest reading of every node's host (of ``node`` only, if given), by node."""
    records = _latest(db, HOST, {} if node is None else {"node": node})
    hosts = []
    for record in records:
        del record["timestamp"]
        hosts.append(HostReading(**record))
    return sorted(hosts, key=lambda h: h.node)


def latest_job_hosts(db: Database, *, job_id: str | None = None) -> list[JobHostReading]:
    """Each job's share of each node it runs on now (of ``job_id`` only, if given), by job and node.

    A job is on a node now when its newest row is as new as the node's newest host row (the node's last snapshot
    still listed it); on a node without host rows, its newest row counts."""
    records = _latest(db, JOB_HOST, {} if job_id is None else {"job_id": job_id})
    nodes = sorted({r["node"] for r in records})
    hosts = (
        [r for node in nodes for r in _latest(db, HOST, {"node": node})] if len(nodes) <= 8 else _latest(db, HOST, {})
    )
    host_times = {r["node"]: r["timestamp"] for r in hosts}
    out = []
    for record in records:
        newest, at = host_times.get(record["node"]), record.pop("timestamp")
        if newest is not None and at < newest - 1e-3:
            continue
        out.append(JobHostReading(**record))
    return sorted(out, key=lambda j: (j.job_id, j.node))


def _fields(family: Family, names: Sequence[str]) -> list[StoredField]:
    return timeseries.stored_fields(names, family.field_by_name)


def nic_series(
    db: Database, nic_ids: Sequence[str], fields: Sequence[str], start: float, end: float, max_points: int = 1000
) -> dict[str, SeriesData]:
    """Series of ``fields`` (``NIC_FIELDS`` names: gauges as means, counters as rates per second) of the ports
    ``nic_ids`` (``node/device/port``), keyed by nic id; unknown ports are left out."""
    stored = _fields(NIC, fields)
    wanted = {key for key in map(parse_nic_id, nic_ids) if key is not None}
    if not wanted:
        return {}
    d = fabricschema.nic
    with db.session() as session:
        rows = session.execute(
            sa.select(d.c.id, d.c.node, d.c.device, d.c.port).where(d.c.node.in_(sorted({k[0] for k in wanted})))
        ).all()
    ids = {row.id: nic_id(row.node, row.device, row.port) for row in rows if (row.node, row.device, row.port) in wanted}
    return timeseries.family_series(db, NIC, ids, stored, start, end, max_points)


def _ids_by_node(db: Database, table: sa.Table, condition: sa.ColumnElement[bool]) -> Mapping[int, str]:
    with db.session() as session:
        return {row.id: row.node for row in session.execute(sa.select(table.c.id, table.c.node).where(condition))}


def host_series(
    db: Database, nodes: Sequence[str], fields: Sequence[str], start: float, end: float, max_points: int = 1000
) -> dict[str, SeriesData]:
    """Series of host ``fields`` of ``nodes``, keyed by node."""
    stored = _fields(HOST, fields)
    ids = _ids_by_node(db, fabricschema.host, fabricschema.host.c.node.in_(list(nodes)))
    return timeseries.family_series(db, HOST, ids, stored, start, end, max_points) if ids else {}


def job_host_series(
    db: Database, job_id: str, fields: Sequence[str], start: float, end: float, max_points: int = 1000
) -> dict[str, SeriesData]:
    """Series of the job's ``fields`` on each of its nodes, keyed by node."""
    stored = _fields(JOB_HOST, fields)
    ids = _ids_by_node(db, fabricschema.job_host, fabricschema.job_host.c.job_id == job_id)
    return timeseries.family_series(db, JOB_HOST, ids, stored, start, end, max_points) if ids else {}
