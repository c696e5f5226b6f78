"""The overview's headline figures, computed from the grid's cells (pure, so tests check them on records)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from gpulens.dashboard.figures.grids import GridCell
from gpulens.storage.latest import IDLE_UTILIZATION

# A GPU under this utilization is idle (the definition ``gpulens query`` and the cluster summary use).
IDLE_BELOW: Final = IDLE_UTILIZATION
# The reading fields the headline reads.
SUMMARY_FIELDS: Final = (
    "utilization_ratio",
    "memory_used_bytes",
    "memory_total_bytes",
    "power_watts",
    "power_limit_watts",
)


@dataclass(frozen=True, slots=True)
class Headline:
    gpus: int
    up: int  # readable and fresh
    down: int  # reported down (lost, unreadable)
    stale: int  # no recent reading
    busy: int
    idle: int
    allocated_idle: int
    utilization_ratio_mean: float | None
    memory_used_bytes: int
    memory_total_bytes: int
    power_watts: float
    power_limit_watts: float
    nodes: int


def headline(cells: Sequence[GridCell]) -> Headline:
    fresh = [c for c in cells if c.reading.up and not c.stale]
    utils = [(c, u) for c in fresh if (u := c.reading.utilization_ratio) is not None]
    idle = [c for c, u in utils if u < IDLE_BELOW]
    return Headline(
        gpus=len(cells),
        up=len(fresh),
        down=sum(1 for c in cells if not c.reading.up and not c.stale),
        stale=sum(1 for c in cells if c.stale),
        busy=len(utils) - len(idle),
        idle=len(idle),
        allocated_idle=sum(1 for c in idle if c.jobs),
        utilization_ratio_mean=statistics.fmean(u for _, u in utils) if utils else None,
        memory_used_bytes=sum(c.reading.memory_used_bytes or 0 for c in fresh),
        memory_total_bytes=sum(c.reading.memory_total_bytes or 0 for c in fresh),
        power_watts=sum(c.reading.power_watts or 0.0 for c in fresh),
        power_limit_watts=sum(c.reading.power_limit_watts or 0.0 for c in fresh),
        nodes=len({c.reading.node for c in cells}),
    )
