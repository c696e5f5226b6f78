"""One scrape round: the record the collector hands to whatever runs after it (the alert engine is one)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gpulens.model import NodeSnapshot, TargetHealth


@dataclass
class RoundResult:
    """What one scrape round found and what became of it."""

    time: float
    snapshots: list[NodeSnapshot]
    targets: list[TargetHealth]
    rejected: dict[str, int] = field(default_factory=dict)
    written: bool = False
    spooled: bool = False
    replayed: int = 0
    duration_s: float = 0.0
    # False: a standby round of an HA pair's collector (collector.pair): nothing was scraped or written, and the
    # hooks that run in the active process only (collector.pair.WhileActive) stop.
    leading: bool = True


RoundHook = Callable[[RoundResult], None]
