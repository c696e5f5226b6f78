"""Counter rates: the one function that turns two reads of a cumulative counter into a per-second rate.

Every source that fills a ``*_per_second`` field from a ``*_total`` counter at the source (RDMA port traffic, a job's
CPU seconds) uses it, so a reset, a first read or a clock that did not move are treated the same everywhere.
"""

from __future__ import annotations


def counter_rate(previous: float | None, current: float | None, elapsed_seconds: float | None) -> float | None:
    """``(current - previous) / elapsed_seconds``, or ``None`` when it cannot be known.

    ``None`` when either value is unknown (a first read has no ``previous``), when no time elapsed (or the clock went
    backwards), and when the counter went down: a reset (a driver reload, ``perfquery -R``, a new cgroup) restarts
    the counter, and the next read gives a rate again.
    """
    if previous is None or current is None or elapsed_seconds is None or elapsed_seconds <= 0:
        return None
    if current < previous:
        return None
    return (current - previous) / elapsed_seconds
