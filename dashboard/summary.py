"""The overview's headline figures, computed from the grid's cells, or in part from the nodes' totals a store keeps
(pure, so tests check them on records)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from gpulens.dashboard.figures.grids import GridCell
from gpulens.storage.records import IDLE_UTILIZATION, NodeTotals

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
    summed_at: float | None = None  # busy to power summed by the store at this time (None: from the cells now)


def headline(cells: Sequence[GridCell], totals: Sequence[NodeTotals] | None = None) -> Headline:
    """The GPUs, up, down and stale from ``cells``; busy, idle, allocated-but-idle, utilization, memory and power
    from ``totals`` where given (the store's sums of the GPUs up as of its last evaluation), else from ``cells``."""
    if totals is not None:
        return _with_totals(cells, totals)
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


def _with_totals(cells: Sequence[GridCell], totals: Sequence[NodeTotals]) -> Headline:
    reporting = sum(t.busy + t.idle for t in totals)
    return Headline(
        gpus=len(cells),
        up=sum(1 for c in cells if c.reading.up and not c.stale),
        down=sum(1 for c in cells if not c.reading.up and not c.stale),
        stale=sum(1 for c in cells if c.stale),
        busy=sum(t.busy for t in totals),
        idle=sum(t.idle for t in totals),
        allocated_idle=sum(t.allocated_idle for t in totals),
        utilization_ratio_mean=sum(t.utilization_ratio_sum for t in totals) / reporting if reporting else None,
        memory_used_bytes=round(sum(t.memory_used_bytes for t in totals)),
        memory_total_bytes=round(sum(t.memory_total_bytes for t in totals)),
        power_watts=sum(t.power_watts for t in totals),
        power_limit_watts=sum(t.power_limit_watts for t in totals),
        nodes=len({c.reading.node for c in cells}),
        summed_at=min((t.timestamp for t in totals), default=None),
    )
