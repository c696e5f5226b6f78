"""The aggregate SQL of the sample tiers, in one place: what rollups store and what reads merge across tiers.

A field is aggregated by its kind: gauges to min/mean/max, counters to an increase (each sample counts from the one
before; a counter that went down was reset and counts from zero), bitmasks to an OR. Two shapes of the same
aggregates are produced here, from either source (raw samples, or the rows of a rollup tier):

- ``summary``: the rollup columns of a bucket (``<column>_min``/``_mean``/``_max``, ``_increase``, ``_or``), which
  ``gpulens.storage.rollup`` writes;
- ``partials``: parts that merge across tiers and buckets (gauges: count, sum, min, max; counters: increase and the
  milliseconds it spans; bitmasks: OR), which ``storage.series`` and ``storage.jobstats`` read and ``merged`` ends.

Raw counters need each sample's predecessor: ``window_columns`` is the projection (``d_<column>``, ``dt``) that the
outer aggregates read, over a window ``w`` partitioned by GPU (or any family's key: ``storage.fabricschema``) and
ordered by time. Everything is in stored units.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpulens.storage.schema import StoredField


def window_columns(fields: Sequence[StoredField], *, counters_only: bool = False, key: str = "gpu_id") -> list[str]:
    """The inner projection of raw samples that the raw aggregates read: time gap and counter deltas over ``w``.

    ``key``: the column naming a series (``gpu_id``, or another family's key: ``gpulens.storage.fabricschema``)."""
    inner = [key, "ts_ms", "ts_ms - LAG(ts_ms) OVER w AS dt"]
    for f in fields:
        c = f.column
        if f.kind == "counter":
            inner += [c, f"{c} - LAG({c}) OVER w AS d_{c}"]
        elif not counters_only:
            inner.append(c)
    return inner


def raw_increase(f: StoredField) -> str:
    """A counter's increase over raw samples (read through ``window_columns``): a drop counts from zero."""
    return f"sum(CASE WHEN d_{f.column} < 0 THEN {f.column} ELSE d_{f.column} END)"


def partials(f: StoredField, source: str, prefix: str = "") -> list[str]:
    """The mergeable parts of ``f`` from ``source`` ("raw" or a rollup tier); ``prefix`` qualifies column names.

    Gauges: count, sum, min, max (a rollup row weighs its mean by its sample count ``n``). Counters: increase and the
    elapsed milliseconds it spans. Bitmasks: OR.
    """
    c = f"{prefix}{f.column}"
    if source == "raw":
        if f.kind == "gauge":
            return [f"count({c})", f"sum({c})", f"min({c})", f"max({c})"]
        if f.kind == "counter":
            return [raw_increase(f), f"sum(CASE WHEN d_{f.column} IS NOT NULL THEN {prefix}dt END)"]
        return [f"bit_or({c})"]
    if f.kind == "gauge":
        weight = f"sum(CASE WHEN {c}_mean IS NOT NULL THEN {prefix}n END)"
        return [weight, f"sum({c}_mean * {prefix}n)", f"min({c}_min)", f"max({c}_max)"]
    if f.kind == "counter":
        return [f"sum({c}_increase)", f"sum(CASE WHEN {c}_increase IS NOT NULL THEN {prefix}elapsed_ms END)"]
    return [f"bit_or({c}_or)"]


def square_sum(f: StoredField, source: str, prefix: str = "") -> str:
    """The sum of squares of a gauge (for a standard deviation); from rollups, of bucket means weighted by ``n``."""
    c = f"{prefix}{f.column}"
    if source == "raw":
        return f"sum({c} * 1.0 * {c})"  # * 1.0: a smallint square overflows on PostgreSQL
    return f"sum({c}_mean * {c}_mean * {prefix}n)"


def summary(f: StoredField, source: str, dialect: str, prefix: str = "") -> list[str]:
    """The rollup columns of ``f`` for one bucket, in ``f.aggregates`` order, from ``source``.

    Raw gauges use avg() (PostgreSQL averages integers as numeric, several times slower than double precision, so
    they are cast first); rollup means are the sample-weighted mean of the finer buckets' means.
    """
    parts = partials(f, source, prefix)
    if f.kind == "gauge":
        if source == "raw":
            c = f"{prefix}{f.column}"
            mean = f"avg(CAST({c} AS DOUBLE PRECISION))" if dialect == "postgresql" else f"avg({c})"
        else:
            mean = f"{parts[1]} / {parts[0]}"
        return [parts[2], mean, parts[3]]
    return parts[:1]


def merged(f: StoredField, j: int, dialect: str) -> list[str]:
    """The end of a merge of ``partials`` aliased ``p{j}_{k}``: gauges' mean, min, max; counters' rate per second."""
    real = "DOUBLE PRECISION" if dialect == "postgresql" else "REAL"
    if f.kind == "gauge":
        return [
            f"CASE WHEN sum(p{j}_0) > 0 THEN CAST(sum(p{j}_1) AS {real}) / sum(p{j}_0) END",
            f"min(p{j}_2)",
            f"max(p{j}_3)",
        ]
    if f.kind == "counter":
        return [f"CASE WHEN sum(p{j}_1) > 0 THEN CAST(sum(p{j}_0) AS {real}) * 1000 / sum(p{j}_1) END"]
    return [f"bit_or(p{j}_0)"]


def rollup_columns(fields: Sequence[StoredField]) -> list[str]:
    """Every rollup column name of ``fields`` in table order (after gpu_id, ts_ms, n, elapsed_ms)."""
    return [f"{f.column}_{aggregate}" for f in fields for aggregate in f.aggregates]
