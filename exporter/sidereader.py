"""Readers off the collection path: each on its own thread, with its own schedule and deadline.

Two shapes. ``DeadlineWorker`` is the GPU source's own thread: the poller hands it one read at a time and waits at
most a deadline for it; a read past it is left to finish (or never) while the poller serves the last readings marked
stale, and no second read starts until it returns, so a hung driver strands one thread, not one per collection.
``SideReader`` is a side reader (the kubelet's pod resources, the fabric and host in sysfs): it fetches every
``interval_s`` on its own thread and keeps its last good answer; the collection takes that answer and never waits.
A reader whose last success is older than its interval plus its deadline is stale: its part is served as it last
was and marked (``gpulens_exporter_reader_stale{reader}``, ``gpulens_exporter_reader_age_seconds{reader}``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from gpulens.logutil import LogOnce
from gpulens.model import NodeSnapshot

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ReaderState:
    """One reader as /metrics shows it: seconds since its last success (None before the first) and whether that
    is past its limit."""

    age_s: float | None
    stale: bool


class _Job:
    def __init__(self, call: Callable[[], object]) -> None:
        self.call = call
        self.done = threading.Event()
        self.value: object = None
        self.error: BaseException | None = None


class Late(Exception):  # noqa: N818 - an outcome, not a failure of the caller
    """The call is still running past its deadline (or an earlier one still is): nothing new was started."""


class DeadlineWorker:
    """One daemon thread that runs one call at a time; ``run`` waits for it at most ``timeout_s``."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queued: _Job | None = None
        self._pending: _Job | None = None  # the last job handed over, until its outcome is taken
        self._thread: threading.Thread | None = None
        self._closed = False

    def run(self, call: Callable[[], T], timeout_s: float) -> T:
        """``call()``'s value; its exception; or ``Late`` when it has not returned within ``timeout_s`` (or the
        previous call still has not: then nothing new runs). A late call that has since returned gives its value
        now, and the next ``run`` starts a fresh call."""
        with self._lock:
            pending = self._pending
            if pending is not None:
                if not pending.done.is_set():
                    raise Late  # the earlier call is still running: nothing new is stranded behind it
                self._pending = None  # a late answer that has arrived since: newer than anything held
                return cast("T", self._outcome(pending))
            pending = self._pending = _Job(call)
            self._queued = pending
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
                self._thread.start()
            self._wake.notify()
        if not pending.done.wait(timeout_s):
            raise Late
        with self._lock:
            if self._pending is pending:
                self._pending = None
        return cast("T", self._outcome(pending))

    @property
    def busy(self) -> bool:
        with self._lock:
            return self._pending is not None and not self._pending.done.is_set()

    @staticmethod
    def _outcome(job: _Job) -> Any:
        if job.error is not None:
            raise job.error
        return job.value

    def close(self) -> None:
        """End the thread once its call returns (a call stuck for good keeps it: it is a daemon)."""
        with self._lock:
            self._closed = True
            self._wake.notify()

    def _work(self) -> None:
        while True:
            with self._lock:
                while self._queued is None and not self._closed:
                    self._wake.wait()
                if self._queued is None:
                    self._thread = None
                    return
                job, self._queued = self._queued, None
            try:
                job.value = job.call()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                job.error = exc
            job.done.set()


class SideReader(Generic[T]):
    """Fetches ``fetch()`` every ``interval_s`` on its own daemon thread and keeps the last good answer.

    ``deadline_s``: how late a fetch may be before the reader is stale (it cannot be interrupted; the reader's one
    thread waits for it, and nothing else does). ``clock``: monotonic seconds. ``start=False`` starts no thread:
    the owner calls ``fetch_now`` (tests).
    """

    def __init__(
        self,
        name: str,
        fetch: Callable[[], T],
        *,
        interval_s: float,
        deadline_s: float,
        clock: Callable[[], float] = time.monotonic,
        start: bool = True,
    ) -> None:
        if interval_s <= 0 or deadline_s <= 0:
            raise ValueError("the interval and the deadline must be positive")
        self.name = name
        self._fetch = fetch
        self._interval = interval_s
        self._limit = interval_s + deadline_s
        self._clock = clock
        self._once = LogOnce(log)
        self._lock = threading.Lock()
        self._value: T | None = None
        self._ok_at: float | None = None
        self._error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.fetches = 0
        if start:
            self._thread = threading.Thread(target=self._run, name=f"gpulens-{name}", daemon=True)
            self._thread.start()

    def latest(self) -> T | None:
        """The last good answer, or None before the first."""
        with self._lock:
            return self._value

    @property
    def error(self) -> str | None:
        """Why the last fetch failed, or None when it succeeded."""
        with self._lock:
            return self._error

    def state(self) -> ReaderState:
        with self._lock:
            ok_at = self._ok_at
        if ok_at is None:
            return ReaderState(None, stale=True)
        age = max(0.0, self._clock() - ok_at)
        return ReaderState(round(age, 3), stale=age > self._limit)

    def fetch_now(self) -> None:
        """One fetch on the calling thread (the thread's step)."""
        self.fetches += 1
        try:
            value = self._fetch()
        except Exception as exc:  # noqa: BLE001 - a side reader's failure marks its own part stale, nothing else
            with self._lock:
                self._error = f"{type(exc).__name__}: {exc}"
            what = "%s reader failed: %s (its part is served as last read)"
            self._once(f"fail:{type(exc).__name__}", what, self.name, exc)
            return
        with self._lock:
            self._value, self._ok_at, self._error = value, self._clock(), None

    def close(self) -> None:
        self._stop.set()

    @property
    def closed(self) -> bool:
        return self._stop.is_set()

    def _run(self) -> None:
        self.fetch_now()
        self.run_forever()

    def run_forever(self) -> None:
        """Fetch every interval after the one just made, until closed (the thread's loop)."""
        next_at = time.monotonic()
        while True:
            next_at = max(next_at + self._interval, time.monotonic())
            if self._stop.wait(next_at - time.monotonic()):
                return
            self.fetch_now()


class BackgroundEnricher:
    """An enricher moved off the collection path: it runs on its own ``SideReader`` over the latest snapshot it was
    handed, and each collection takes the snapshot ``fields`` it owns (and the failure counts it added) from its
    last answer. The first collection waits for the first answer at most ``deadline_s``; none waits again."""

    def __init__(
        self,
        name: str,
        enrich: Callable[[NodeSnapshot], NodeSnapshot],
        fields: tuple[str, ...],
        *,
        interval_s: float,
        deadline_s: float,
        start: bool = True,
    ) -> None:
        self._enrich = enrich
        self._fields = fields
        self._deadline = deadline_s
        self._input: NodeSnapshot | None = None
        self._handed = threading.Event()
        self._answered = threading.Event()
        self.reader: SideReader[tuple[dict[str, object], dict[str, int]]] = SideReader(
            name, self._fetch, interval_s=interval_s, deadline_s=deadline_s, start=False
        )
        self._thread: threading.Thread | None = None
        if start:
            self._thread = threading.Thread(target=self._first_then_run, name=f"gpulens-{name}", daemon=True)
            self._thread.start()

    def enrich(self, snapshot: NodeSnapshot) -> NodeSnapshot:
        self._input = snapshot
        if not self._handed.is_set():
            self._handed.set()
            if self._thread is not None:
                self._answered.wait(self._deadline)
        latest = self.reader.latest()
        if latest is None:
            return snapshot
        values, errors = latest
        return snapshot.replace(**values, errors={**snapshot.errors, **errors})

    def close(self) -> None:
        self.reader.close()
        self._handed.set()

    def _fetch(self) -> tuple[dict[str, object], dict[str, int]]:
        given = self._input
        if given is None:
            raise LookupError("no snapshot handed yet")
        out = self._enrich(given)
        errors = {k: v for k, v in out.errors.items() if given.errors.get(k) != v}
        return {f: getattr(out, f) for f in self._fields}, errors

    def _first_then_run(self) -> None:
        self._handed.wait()
        if self.reader.closed:  # closed before the first collection
            return
        self.reader.fetch_now()
        self._answered.set()
        self.reader.run_forever()
