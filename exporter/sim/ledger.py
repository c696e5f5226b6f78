"""A running sum of per-step rates, extended on demand: what the simulator's cumulative counters are built from.

A counter that must stay consistent with its rate (``*_total`` beside ``*_per_second``) is the integral of the
rate over the steps, so the difference of two readings over the time between them is the rate itself. The sum is
kept once per shared context and extended as later steps are asked for (thread-safe).
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Callable, Sequence


class RateLedger:
    """Running sums of ``width`` rates; ``rates_at(k)`` gives step ``k``'s rates (per second)."""

    def __init__(self, rates_at: Callable[[int], Sequence[float]], width: int, last_step: int, step_s: float) -> None:
        self._rates_at = rates_at
        self._width = width
        self._last = last_step  # from this step on the rates no longer change
        self._step = step_s
        self._prefix = [array("d", [0.0]) for _ in range(width)]
        self._tail = tuple(rates_at(last_step))
        self._lock = threading.Lock()

    def through(self, k: int) -> tuple[float, ...]:
        """Each rate's integral from the scenario's start to the end of step ``k`` (zero before the start)."""
        if k < 0:
            return (0.0,) * self._width
        upto = min(k + 1, self._last)
        with self._lock:
            prefix = self._prefix
            for i in range(len(prefix[0]) - 1, upto):
                rates = self._rates_at(i)
                for column, rate in zip(prefix, rates, strict=True):
                    column.append(column[i] + rate * self._step)
            done = tuple(column[upto] for column in prefix)
        extra = k + 1 - upto
        if extra <= 0:
            return done
        return tuple(d + extra * r * self._step for d, r in zip(done, self._tail, strict=True))

    def rates(self, k: int) -> tuple[float, ...]:
        """Step ``k``'s rates, as the running sums give them (so that they and the totals always agree)."""
        if k < 0:
            return (0.0,) * self._width
        if k >= self._last:
            return self._tail
        self.through(k)
        with self._lock:
            return tuple((column[k + 1] - column[k]) / self._step for column in self._prefix)
