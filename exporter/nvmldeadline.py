"""The deadline of every NVML call: a call that does not return in time marks the node's NVML as hung.

A wedged driver does not fail its calls: it never returns from them, and a C call cannot be cancelled from Python.
``CallDeadline`` times every call that ``nvmlcalls.Calls`` makes (``begin``/``end``). Once a call has run past
``deadline_s`` the node's NVML is hung: every later call fails at once with ``NvmlHungError`` (nothing new is
stranded in the driver), until a probe passes. The probe is the first call made at least ``probe_every_s`` after the
last one, once no call is stuck any more: if it returns within the deadline, NVML answers again. The threads a hang
can strand are those already inside a call when it began: the source's read thread and its fixed GPU pools; no
thread is ever started for a call.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Final

from gpulens.model import SourceError

log = logging.getLogger(__name__)

DEFAULT_DEADLINE_S: Final = 5.0  # an NVML call returns in microseconds to tens of milliseconds; 5 s is a wedge
DEFAULT_PROBE_EVERY_S: Final = 30.0


class NvmlHungError(SourceError):
    """The node's NVML is hung: a call passed its deadline and no probe has passed since."""


class CallDeadline:
    """Times every NVML call in flight, says when NVML is hung, and lets one probe call through on a schedule.

    ``monotonic`` and ``wall`` are clocks (seconds); ``hung_since`` is wall time, for the node's readings.
    """

    def __init__(
        self,
        *,
        deadline_s: float = DEFAULT_DEADLINE_S,
        probe_every_s: float = DEFAULT_PROBE_EVERY_S,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if deadline_s <= 0 or probe_every_s <= 0:
            raise ValueError("the deadline and the probe interval must be positive")
        self.deadline_s = deadline_s
        self._probe_every = probe_every_s
        self._monotonic = monotonic
        self._wall = wall
        self._lock = threading.Lock()
        self._tokens = itertools.count()
        self._in_flight: dict[int, tuple[str, float]] = {}  # token -> (call, when it began: monotonic)
        self._hung: tuple[str, float] | None = None  # (the call that passed the deadline, since: wall time)
        self._last_try = 0.0  # monotonic: when the last probe began (or the hang was seen)
        self._probe: int | None = None  # the token of the probe in flight

    def begin(self, what: str) -> int:
        """Note a call about to run; raises ``NvmlHungError`` while NVML is hung and no probe is due."""
        now = self._monotonic()
        with self._lock:
            self._mark(now)
            token = next(self._tokens)
            if self._hung is not None:
                stuck = any(t != self._probe for t in self._in_flight)
                if stuck or self._probe is not None or now - self._last_try < self._probe_every:
                    raise NvmlHungError(self._message())
                self._probe, self._last_try = token, now  # this call is the probe
            self._in_flight[token] = (what, now)
            return token

    def end(self, token: int) -> None:
        """Note a call that returned (with a value or an error: either way the driver answered)."""
        now = self._monotonic()
        with self._lock:
            self._mark(now)  # a call that returns past its deadline marks NVML hung all the same
            what, started = self._in_flight.pop(token, ("", now))
            if token != self._probe:
                return
            self._probe = None
            if now - started <= self.deadline_s and self._hung is not None:
                log.warning("NVML answers again (%s returned in %.2fs): no longer hung", what, now - started)
                self._hung = None

    def hung_since(self) -> float | None:
        """When (wall time) NVML was first seen hung, or None while it answers."""
        with self._lock:
            self._mark(self._monotonic())
            return None if self._hung is None else self._hung[1]

    def hung_call(self) -> str | None:
        with self._lock:
            return None if self._hung is None else self._hung[0]

    def _mark(self, now: float) -> None:
        """Mark NVML hung when a call in flight has passed the deadline. Callers hold the lock."""
        if self._hung is not None:
            return
        for what, started in self._in_flight.values():
            if now - started > self.deadline_s:
                self._hung = (what, self._wall() - (now - started) + self.deadline_s)
                self._last_try = now
                log.error(
                    "NVML is hung: %s has not returned in %.1fs; NVML calls fail at once until it answers "
                    "(probed every %gs)",
                    what,
                    now - started,
                    self._probe_every,
                )
                return

    def _message(self) -> str:
        what = self._hung[0] if self._hung is not None else "a call"
        return f"NVML is hung: {what} passed its {self.deadline_s:g}s deadline"
