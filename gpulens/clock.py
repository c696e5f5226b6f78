"""Clocks, injected wherever time is read, so tests and the simulator control time."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Wall-clock time in seconds since the epoch."""
        ...

    def monotonic(self) -> float:
        """A monotonic time in seconds, for durations and deadlines."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class ScaledClock:
    """Virtual time that starts at ``start`` and runs ``speed`` times faster than the real clock."""

    def __init__(self, start: float, speed: float = 1.0, base: Clock | None = None) -> None:
        if speed <= 0:
            raise ValueError("speed must be positive")
        self._base = base or SystemClock()
        self._start = start
        self._speed = speed
        self._origin = self._base.monotonic()

    def now(self) -> float:
        return self._start + (self._base.monotonic() - self._origin) * self._speed

    def monotonic(self) -> float:
        return self._base.monotonic()


class ManualClock:
    """A clock that moves only when told to (tests, ``gpulens simulate``)."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        return self.now()

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds

    def set(self, when: float) -> None:
        with self._lock:
            self._now = when
