"""Time series of GPU fields over a range, at most a given number of points, from whichever tiers hold them.

The plan (``gpulens.storage.tiers``) says which tier serves which part of the range; each part's partial aggregates
(``storage.aggregates``) are merged per GPU and bucket into means (gauges), rates per second (counters: fields ending
in ``_total``) or ORs (bitmasks), then decoded to SI units.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping, Sequence
from itertools import repeat
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.orm import Session

from gpulens.storage import aggregates, driverread, rawseries, schema, tiers
from gpulens.storage.db import Database
from gpulens.storage.fabricschema import GPU, Family
from gpulens.storage.records import SeriesData
from gpulens.storage.rollup import COUNTER_LOOKBACK_MS


def _partials(tier: str, fields: Sequence[schema.StoredField]) -> list[str]:
    """Per field, its partial aggregates from ``tier``: column p{j}_{k} is part k of field j."""
    out: list[str] = []
    for j, f in enumerate(fields):
        out += [f"{part} AS p{j}_{k}" for k, part in enumerate(aggregates.partials(f, tier))]
    return out


def _segment_sql(
    family: Family, tier: str, fields: Sequence[schema.StoredField], i: int, minutes: str, dialect: str
) -> str:
    """Per id and bucket (ts_ms / :step), the partial aggregates of ``fields`` over [lo_i, hi_i) of one tier."""
    partials = ", ".join(_partials(tier, fields))
    key = family.key
    if tier != "raw":
        return (
            f"SELECT {key}, ts_ms / :step AS b, {partials} FROM {family.table(tier)} "  # noqa: S608
            f"WHERE {key} IN :ids AND ts_ms >= :lo_{i} AND ts_ms < :hi_{i} GROUP BY {key}, ts_ms / :step"
        )
    inner = aggregates.window_columns(fields, key=key)
    source = family.source(dialect, fields)  # the profiles joined only for a profile field
    return (
        f"SELECT {key}, ts_ms / :step AS b, {partials} FROM (SELECT {', '.join(inner)} "  # noqa: S608
        f"FROM {source} WHERE {key} IN :ids AND ts_ms >= :read_from_{i} AND ts_ms < :hi_{i} {minutes} "
        f"WINDOW w AS (PARTITION BY {key} ORDER BY ts_ms)) AS x WHERE ts_ms >= :lo_{i} GROUP BY {key}, ts_ms / :step"
    )


def _series_sql(
    dialect: str, plan: Sequence[tiers.Segment], fields: Sequence[schema.StoredField], family: Family = GPU
) -> str:
    """All segments' partial aggregates, merged per id and bucket into means, rates and ORs in stored units."""
    cte, minutes = "", ""
    for i, segment in enumerate(plan):
        if segment.tier == "raw":
            cte, minutes = tiers.minutes_cte(dialect, f":read_from_{i}", f":hi_{i}")
    union = " UNION ALL ".join(
        _segment_sql(family, seg.tier, fields, i, minutes, dialect) for i, seg in enumerate(plan)
    )
    finals = [sql for j, f in enumerate(fields) for sql in aggregates.merged(f, j, dialect)]
    return (
        f"{cte}SELECT {family.key}, b, {', '.join(finals)} FROM ({union}) AS u "  # noqa: S608 (constant identifiers)
        f"GROUP BY {family.key}, b ORDER BY {family.key}, b"
    )


@functools.lru_cache(maxsize=256)
def _bucketed_statement(
    dialect: str, plan: tuple[str, ...], fields: tuple[schema.StoredField, ...], family: Family
) -> sa.TextClause:
    """The bucketed query of a plan of these tiers (the bounds are parameters)."""
    segments = [tiers.Segment(tier, 0, 0) for tier in plan]
    return sa.text(_series_sql(dialect, segments, fields, family)).bindparams(sa.bindparam("ids", expanding=True))


def stored_fields(
    names: Sequence[str], known: Mapping[str, schema.StoredField] = schema.FIELD_BY_NAME
) -> list[schema.StoredField]:
    """The stored fields named ``names`` among ``known``; an unknown name raises ``ValueError``."""
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"unknown fields {', '.join(unknown)}; known: {', '.join(known)}")
    return [known[name] for name in names]


# The GPUs' ids and every tier's state in one statement (a read of one GPU is then two statements), read through
# the driver (``gpulens.storage.driverread``), the uuids' list put in its braces.
_GPU_IDS_AND_TIERS: Final = (
    "SELECT 0, id, uuid, NULL, NULL FROM gpu WHERE uuid IN {} "
    "UNION ALL SELECT 1, NULL, tier, position_ms, horizon_ms FROM tier_state"
)


def _gpu_ids_and_tiers(
    session: Session, uuids: Sequence[str]
) -> tuple[dict[int, str], dict[str, tuple[int | None, int | None]]]:
    """The ids of the GPUs ``uuids`` (id -> uuid) and ``tiers.tier_state``, read together."""
    ids: dict[int, str] = {}
    state: dict[str, tuple[int | None, int | None]] = {}
    listed, params = driverread.in_list("u", uuids)
    for kind, key, name, position, horizon in driverread.rows(session, _GPU_IDS_AND_TIERS.format(listed), params):
        if kind == 0:
            ids[key] = name
        else:
            state[name] = (position, horizon)
    return ids, state


def series(
    db: Database,
    uuids: Sequence[str],
    fields: Sequence[str],
    start: float,
    end: float,
    max_points: int = 1000,
) -> dict[str, SeriesData]:
    """Time series of ``fields`` for the GPUs ``uuids`` over [start, end], at most ``max_points`` per GPU.

    Unknown UUIDs are left out of the result; an unknown field raises ``ValueError``.
    """
    stored = stored_fields(fields)
    with db.session() as session:
        ids, state = _gpu_ids_and_tiers(session, uuids)
        return _family_series(session, db.dialect, GPU, ids, stored, start, end, max_points, state)


def family_series(
    db: Database,
    family: Family,
    ids: Mapping[int, str],
    stored: Sequence[schema.StoredField],
    start: float,
    end: float,
    max_points: int = 1000,
) -> dict[str, SeriesData]:
    """Time series of ``stored`` fields of the family's rows ``ids`` (id -> the name to key the result and to put in
    ``SeriesData.uuid``) over [start, end], at most ``max_points`` per row."""
    with db.session() as session:
        return _family_series(session, db.dialect, family, ids, stored, start, end, max_points)


def _family_series(
    session: Session,
    dialect: str,
    family: Family,
    ids: Mapping[int, str],
    stored: Sequence[schema.StoredField],
    start: float,
    end: float,
    max_points: int,
    state: Mapping[str, tuple[int | None, int | None]] | None = None,
) -> dict[str, SeriesData]:
    """``family_series`` in ``session``; ``state``: the tiers' state if already read."""
    if max_points < 2:
        raise ValueError("max_points must be at least 2")
    if end < start:
        raise ValueError("end is before start")
    start_ms, end_ms = round(start * 1000), round(end * 1000)
    plan = tiers.plan(
        tiers.tier_state(session) if state is None else state, start_ms, end_ms, (end_ms - start_ms) / (max_points - 1)
    )
    step = tiers.step_ms(start_ms, end_ms, max_points, tiers.TIER_WIDTH_MS[plan[0].tier])
    columns: dict[int, list[Sequence[Any]]] | None = None  # per id: buckets, then each field's values
    if ids and stored and rawseries.applies(plan, ids):  # a short raw range: its rows, merged in Python
        window = (plan[0].lo_ms - COUNTER_LOOKBACK_MS, plan[0].lo_ms, plan[0].hi_ms)
        columns = rawseries.rows(session, dialect, family, list(ids), stored, window, step, max_points)
    if ids and stored and columns is None:
        params: dict[str, Any] = {"ids": list(ids), "step": step}
        for i, segment in enumerate(plan):
            params |= {f"lo_{i}": segment.lo_ms, f"hi_{i}": segment.hi_ms}
            params[f"read_from_{i}"] = segment.lo_ms - COUNTER_LOOKBACK_MS
        statement = _bucketed_statement(dialect, tuple(s.tier for s in plan), tuple(stored), family)
        by_id: dict[int, list[Sequence[Any]]] = {}
        for row in session.execute(statement, params):
            by_id.setdefault(row[0], []).append(row[1:])
        columns = {key: list(zip(*rows, strict=True)) for key, rows in by_id.items()}
    empty: list[Sequence[Any]] = [()] * (1 + sum(3 if f.kind == "gauge" else 1 for f in stored))
    found = columns or {}
    return {uuid: _series_data(uuid, found.get(key, empty), stored, step, plan[0].tier) for key, uuid in ids.items()}


def _si(f: schema.StoredField, values: Sequence[Any]) -> tuple[float | None, ...]:
    """A column of stored values in SI units: ``StoredField.to_si``'s arithmetic (so the same floats), done by
    ``map`` over C operators (a method call per value was a third of a one-GPU read). A gap (None) stops that pass
    with a TypeError, and the column is done again value by value: no scan for gaps first (it cost as much as the
    arithmetic)."""
    unit, per_unit = f.unit, f.per_unit
    try:
        if unit == 1:  # v * 1 / per_unit is v / per_unit, the same float
            return tuple(map(operator.truediv, values, repeat(per_unit)))
        return tuple(map(operator.truediv, map(operator.mul, values, repeat(unit)), repeat(per_unit)))
    except TypeError:
        return tuple(None if v is None else v * unit / per_unit for v in values)


def _series_data(
    uuid: str, columns: Sequence[Sequence[Any]], fields: Sequence[schema.StoredField], step: int, resolution: str
) -> SeriesData:
    """One series from its columns: bucket numbers, then per gauge mean, min, max, per counter and bitmask one."""
    values: dict[str, tuple[float | None, ...]] = {}
    minimum: dict[str, tuple[float | None, ...]] = {}
    maximum: dict[str, tuple[float | None, ...]] = {}
    column = 1
    for f in fields:
        if f.kind == "gauge":
            # Buckets of one sample each (``rawseries``) give one column for all three: converted once.
            mean, low, high = columns[column : column + 3]
            values[f.name] = _si(f, mean)
            minimum[f.name] = values[f.name] if low is mean else _si(f, low)
            maximum[f.name] = minimum[f.name] if high is low else _si(f, high)
            column += 3
        else:  # a rate or an OR: one value per bucket
            values[f.name] = minimum[f.name] = maximum[f.name] = _si(f, columns[column])
            column += 1
    return SeriesData(
        uuid=uuid,
        resolution=resolution,
        step_seconds=step / 1000,
        timestamps=tuple(b * step / 1000 for b in columns[0]),
        values=values,
        minimum=minimum,
        maximum=maximum,
    )
