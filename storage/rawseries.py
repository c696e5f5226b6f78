"""Short ranges of raw samples read row by row: one index seek per series, the buckets merged in Python.

When the whole range is served by raw samples and holds no more than about ``max_points`` samples per series,
grouping them in SQL (a window for the counters' deltas, then ``GROUP BY`` bucket) costs more than the rows
themselves: most buckets hold one sample. ``rows`` reads the samples of [lo - lookback, hi) in one statement, bounded
by a ``LIMIT`` of ``max_points`` plus the lookback per series, and merges them per bucket with the same arithmetic
as ``gpulens.storage.aggregates``' partials and ``merged`` (means, rates per second, ORs), giving the same values as the
bucketed query. A range with more samples than the limit returns None, and the caller groups in SQL.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Mapping, Sequence
from typing import Any, Final

from sqlalchemy.orm import Session

from gpulens.storage import driverread, schema, tiers
from gpulens.storage.fabricschema import Family

# Rows of the counter lookback a series may hold before the range (samples at most once a second).
LOOKBACK_ROWS: Final = 120


def rows_sql(dialect: str, family: Family, fields: Sequence[schema.StoredField]) -> str:
    """The raw samples of ids [read_from, hi), by id and time, at most :limit rows (GPU profiles joined when asked
    for one of their fields). ``{ids}`` is left for the ids' list (``driverread.in_list``)."""
    cte, minutes = tiers.minutes_cte(dialect, ":read_from", ":hi")
    columns = ", ".join([family.key, "ts_ms", *(f.column for f in fields)])
    return (
        f"{cte}SELECT {columns} FROM {family.source(dialect, fields)} "  # noqa: S608 (constant identifiers)
        f"WHERE {family.key} IN {{ids}} AND ts_ms >= :read_from AND ts_ms < :hi {minutes} "
        f"ORDER BY {family.key}, ts_ms LIMIT :limit"
    )


_rows_sql = functools.lru_cache(maxsize=64)(rows_sql)


def limit(ids: int, max_points: int) -> int:
    """The most rows the raw read takes for ``ids`` series before leaving the range to the bucketed query."""
    return ids * (max_points + LOOKBACK_ROWS)


def rows(
    session: Session,
    dialect: str,
    family: Family,
    ids: Sequence[int],
    fields: Sequence[schema.StoredField],
    window: tuple[int, int, int],
    step: int,
    max_points: int,
) -> dict[int, list[Sequence[Any]]] | None:
    """Per id, the columns of the bucketed query's rows over [lo, hi): bucket numbers (``ts_ms // step``), then
    per gauge mean, min and max, per counter its rate per second, per bitmask its OR (ids without samples left out).

    ``window``: (read_from, lo, hi), read_from being lo less the counter lookback. None when the range holds more
    rows than ``limit``."""
    read_from, lo, hi = window
    most = limit(len(ids), max_points)
    listed, params = driverread.in_list("id", ids)
    sql = _rows_sql(dialect, family, tuple(fields)).format(ids=listed)
    samples = driverread.rows(session, sql, params | {"read_from": read_from, "hi": hi, "limit": most + 1})
    if len(samples) > most:
        return None
    return merge(samples, fields, lo, step)


def merge(
    samples: Sequence[Sequence[Any]], fields: Sequence[schema.StoredField], lo: int, step: int
) -> dict[int, list[Sequence[Any]]]:
    """Samples (id, ts_ms, values...) sorted by id and time, merged per id and bucket from ``lo`` on."""
    out: dict[int, list[Sequence[Any]]] = {}
    start = 0
    while start < len(samples):
        key = samples[start][0]
        end = start
        while end < len(samples) and samples[end][0] == key:
            end += 1
        if columns := _merge_series(samples[start:end], fields, lo, step):
            out[key] = columns
        start = end
    return out


def _merge_series(
    samples: Sequence[Sequence[Any]], fields: Sequence[schema.StoredField], lo: int, step: int
) -> list[Sequence[Any]]:
    """One series' samples (sorted by time) merged per bucket: the arithmetic of ``aggregates.partials``/``merged``.
    Returns its columns (bucket, then the fields' values), or [] when no sample falls in [lo, ...)."""
    first = next((i for i, s in enumerate(samples) if s[1] >= lo), len(samples))
    if first == len(samples):
        return []
    buckets: list[int] = []  # bucket number per sample from ``first`` on
    bounds: list[int] = []  # index (into samples) where each bucket starts
    for i in range(first, len(samples)):
        b = samples[i][1] // step
        if not buckets or buckets[-1] != b:
            buckets.append(b)
            bounds.append(i)
    bounds.append(len(samples))
    single = len(buckets) == len(samples) - first  # every bucket holds one sample
    columns: list[Sequence[Any]] = [buckets]
    for j, f in enumerate(fields, start=2):
        if f.kind == "gauge":
            columns += _gauge(samples, j, first, bounds, single)
        elif f.kind == "counter":
            columns.append(_counter(samples, j, first, bounds, single))
        else:
            columns.append(_bitmask(samples, j, bounds))
    return columns


def _gauge(
    samples: Sequence[Sequence[Any]], j: int, first: int, bounds: Sequence[int], single: bool
) -> list[Sequence[Any]]:
    """Mean (a float, as SQL's CAST(sum AS REAL) / count), min and max per bucket. When every bucket holds one
    sample the three are one column, the stored values (the same object three times): a mean of one value is that
    value, and its conversion to SI units (``timeseries._si``, done once) gives the float SQL's would."""
    if single:
        values = [s[j] for s in samples[first:]]
        return [values, values, values]
    column = [s[j] for s in samples]
    parts = [column[a:b] for a, b in itertools.pairwise(bounds)]  # each bucket's values (never empty)
    if None not in column[first:]:  # the common case: sum, min and max over each bucket, all in C
        sums = map(float, map(sum, parts))
        return [list(map(operator.truediv, sums, map(len, parts))), list(map(min, parts)), list(map(max, parts))]
    means: list[float | None] = []
    lows: list[Any] = []
    highs: list[Any] = []
    for part in parts:
        present = [v for v in part if v is not None]
        means.append(float(sum(present)) / len(present) if present else None)
        lows.append(min(present) if present else None)
        highs.append(max(present) if present else None)
    return [means, lows, highs]


def _counter(
    samples: Sequence[Sequence[Any]], j: int, first: int, bounds: Sequence[int], single: bool
) -> list[float | None]:
    """Rate per second per bucket: increases (a drop counts from zero) over the milliseconds they span, each sample
    counting from the one before it (LAG over the series, the lookback's last sample included)."""
    values = [s[j] for s in samples]
    start = max(first, 1)
    # Per sample: its increase and the milliseconds since the last, None exactly where either value is missing.
    increases: list[Any] = [None] * start
    elapsed: list[Any] = [None] * start
    if None not in values[start - 1 :]:  # the common case, a pass each over whole columns
        times = [s[1] for s in samples]
        pairs = zip(values[start:], values[start - 1 : -1], strict=True)
        increases += [v if v < before else v - before for v, before in pairs]
        elapsed += map(operator.sub, times[start:], times[start - 1 : -1])
    else:
        for i in range(start, len(samples)):
            v, before = values[i], values[i - 1]
            known = v is not None and before is not None
            increases.append((v if v < before else v - before) if known else None)
            elapsed.append(samples[i][1] - samples[i - 1][1] if known else None)
    if single:
        return [None if not e else float(c) * 1000 / e for c, e in zip(increases[first:], elapsed[first:], strict=True)]
    rates: list[float | None] = []
    for k in range(len(bounds) - 1):
        spans = elapsed[bounds[k] : bounds[k + 1]]
        rises = increases[bounds[k] : bounds[k + 1]]
        if None in spans:
            spans = [e for e in spans if e is not None]
            rises = [c for c in rises if c is not None]
        spanned = sum(spans)
        rates.append(float(sum(rises)) * 1000 / spanned if spanned else None)
    return rates


def _bitmask(samples: Sequence[Sequence[Any]], j: int, bounds: Sequence[int]) -> list[Any]:
    ors: list[Any] = []
    for k in range(len(bounds) - 1):
        value = None
        for s in samples[bounds[k] : bounds[k + 1]]:
            if s[j] is not None:
                value = s[j] if value is None else value | s[j]
        ors.append(value)
    return ors


def applies(plan: Sequence[tiers.Segment], ids: Mapping[int, str]) -> bool:
    """The raw read serves a plan of raw samples alone."""
    return bool(ids) and len(plan) == 1 and plan[0].tier == "raw"
