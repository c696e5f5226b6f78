"""Which tier serves which part of a time range: raw samples, 1-minute or 1-hour rollups.

A read of [start, end] picks the coarsest tier that still gives buckets of about the wanted width (and one that
retention has not emptied at the start of the range), reads it up to that tier's rollup position, and takes the rest
from the finer tiers: a ``Segment`` per tier. ``storage.series`` and ``storage.jobstats`` read through this plan.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import sqlalchemy as sa
from sqlalchemy.orm import Session

from gpulens.storage import schema

TIER_WIDTH_MS: Final = {"raw": 1000, "1m": schema.MINUTE_MS, "1h": schema.HOUR_MS}
TIER_TABLE: Final = {"raw": "gpu_sample", "1m": "gpu_rollup_1m", "1h": "gpu_rollup_1h"}


@dataclass(frozen=True, slots=True)
class Segment:
    tier: str
    lo_ms: int
    hi_ms: int  # exclusive


_TIER_STATE: Final = sa.text("SELECT tier, position_ms, horizon_ms FROM tier_state")  # built once: every read asks


def tier_state(session: Session) -> dict[str, tuple[int | None, int | None]]:
    """Per tier, its rollup position and retention horizon (``tier_state``)."""
    return {row[0]: (row[1], row[2]) for row in session.execute(_TIER_STATE)}


def plan(
    state: Mapping[str, tuple[int | None, int | None]], start_ms: int, end_ms: int, step_ms: float
) -> list[Segment]:
    """Which tier serves which part of [start, end]: the chosen tier up to its rollup position, finer ones after."""
    tiers = ["raw", "1m", "1h"]
    chosen = max((i for i, tier in enumerate(tiers) if TIER_WIDTH_MS[tier] <= 2 * step_ms), default=0)
    while chosen < 2 and (horizon := state.get(tiers[chosen], (None, None))[1]) is not None and start_ms < horizon:
        chosen += 1  # retention has emptied the start of the range in this tier
    segments: list[Segment] = []
    lo = start_ms
    for i in range(chosen, -1, -1):
        position = state.get(tiers[i], (None, None))[0] if i > 0 else None
        hi = end_ms + 1 if i == 0 else min(end_ms + 1, position if position is not None else lo)
        if hi > lo:
            segments.append(Segment(tiers[i], lo, hi))
            lo = hi
    return segments


def step_ms(start_ms: int, end_ms: int, max_points: int, width_ms: int) -> int:
    """A bucket width, a whole number of tier widths, that gives at most max_points epoch-aligned buckets."""
    raw_step = (end_ms - start_ms) / (max_points - 1)
    return max(width_ms, math.ceil(raw_step / width_ms) * width_ms)


def minutes_cte(dialect: str, read_from: str, hi: str, alias: str = "") -> tuple[str, str]:
    """SQLite reads a time range of raw samples one minute at a time along their primary key, which leads with the
    stored minute.

    Returns the CTE to put before the query and the condition on ``minute`` (of the table ``alias``, if given) that
    uses it (both empty elsewhere).
    """
    if dialect != "sqlite":
        return "", ""
    cte = (
        "WITH RECURSIVE minutes(m) AS "  # noqa: S608 (read_from and hi are parameter names)
        f"(SELECT {schema.minute_of(read_from)} UNION ALL SELECT m + 1 FROM minutes WHERE m < {schema.minute_of(hi)}) "
    )
    return cte, f"AND {alias + '.' if alias else ''}minute IN (SELECT m FROM minutes)"  # noqa: S608 (an alias)
