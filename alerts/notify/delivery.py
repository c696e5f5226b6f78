"""The one retry stage: a durable outbox of notifications and the loop that delivers what is due.

Notifications are written to the outbox in the same round that decides them, and marked sent only after their
receiver accepted them, so delivery is at-least-once across restarts. A retryable failure (5xx, timeout, connection
error) is retried with exponential backoff and jitter; a 429 waits for its ``Retry-After``; anything else gives up at
once with one logged error. After a retryable failure the run skips that receiver's other items, and a run delivers
at most ``batch`` items, so a receiver that is down is not stormed when it comes back.

Delivery keeps each (group, receiver) in order: a newer state of a group replaces its undelivered older one in the
outbox (``superseded``), taking over its place in the retry schedule, as Alertmanager sends a group's current state.
So a retried FIRING can never arrive after the RESOLVED that followed it. In the collector the delivery runs on its
own thread (``gpulens.alerts.notify.worker``), never inside the scrape round.

``OutboxStore`` is the protocol the SQL outbox in ``storage/`` implements; ``InMemoryOutbox`` is the same for tests
and ``gpulens simulate``.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, Protocol

from gpulens.alerts.grouping import Notification
from gpulens.alerts.notify import DeliveryError, Notifier
from gpulens.clock import Clock

log = logging.getLogger(__name__)

PENDING = "pending"
SENT = "sent"
FAILED = "failed"
SUPERSEDED = "superseded"  # replaced by a newer state of its group before it was delivered


@dataclass(frozen=True)
class OutboxItem:
    id: int
    receiver: str
    payload: Mapping[str, Any]
    attempts: int = 0
    created_at: float = 0.0
    next_attempt_at: float = 0.0
    status: str = PENDING  # "pending" | "sent" | "failed" | "superseded"
    last_error: str | None = None


class OutboxStore(Protocol):
    """Durable storage of notifications waiting to be delivered."""

    def enqueue(self, receiver: str, payload: Mapping[str, Any], now: float) -> int:
        """Store a notification, due at once; returns its id. It supersedes the pending items of the same receiver
        and ``payload["group_key"]``, and takes over their next attempt time and attempt count."""
        ...

    def due(self, now: float, limit: int) -> list[OutboxItem]:
        """Pending items whose next attempt is due, oldest first."""
        ...

    def next_attempt_at(self) -> float | None:
        """When the earliest pending item falls due; None if nothing is pending."""
        ...

    def mark_sent(self, item_id: int, now: float) -> None:
        """The marks change pending items only (a superseded item stays superseded)."""
        ...

    def mark_retry(self, item_id: int, next_attempt_at: float, error: str) -> None:
        """Count a failed attempt and schedule the next one. An item superseded while its send was in flight hands
        the failure to the pending item of its receiver and group: that one takes the attempt count and the later
        next attempt time, so a receiver that hangs past the next resend keeps its backoff."""
        ...

    def mark_failed(self, item_id: int, error: str) -> None:
        """Give up on the item (counts the attempt)."""
        ...


class InMemoryOutbox:
    """An ``OutboxStore`` in a dict: for tests and simulations."""

    def __init__(self) -> None:
        self.items: dict[int, OutboxItem] = {}
        self._next_id = 1

    def enqueue(self, receiver: str, payload: Mapping[str, Any], now: float) -> int:
        item_id = self._next_id
        self._next_id += 1
        key = payload.get("group_key")
        older = [
            i
            for i in self.items.values()
            if key is not None and i.status == PENDING and i.receiver == receiver and i.payload.get("group_key") == key
        ]
        for old in older:
            self.items[old.id] = replace(old, status=SUPERSEDED, last_error=f"replaced by notification {item_id}")
        self.items[item_id] = OutboxItem(
            item_id,
            receiver,
            dict(payload),
            attempts=max((i.attempts for i in older), default=0),
            created_at=now,
            next_attempt_at=max([now, *(i.next_attempt_at for i in older)]),
        )
        return item_id

    def due(self, now: float, limit: int) -> list[OutboxItem]:
        ready = [i for i in self.items.values() if i.status == PENDING and i.next_attempt_at <= now]
        return sorted(ready, key=lambda i: (i.next_attempt_at, i.id))[:limit]

    def next_attempt_at(self) -> float | None:
        return min((i.next_attempt_at for i in self.items.values() if i.status == PENDING), default=None)

    def _pending(self, item_id: int) -> OutboxItem | None:
        item = self.items[item_id]
        return item if item.status == PENDING else None

    def mark_sent(self, item_id: int, now: float) -> None:
        if item := self._pending(item_id):
            self.items[item_id] = replace(item, status=SENT, attempts=item.attempts + 1)

    def mark_retry(self, item_id: int, next_attempt_at: float, error: str) -> None:
        item = self.items[item_id]
        if item.status == PENDING:
            self.items[item_id] = replace(
                item, attempts=item.attempts + 1, next_attempt_at=next_attempt_at, last_error=error
            )
            return
        key = item.payload.get("group_key")
        if item.status != SUPERSEDED or key is None:
            return
        for heir in list(self.items.values()):
            if heir.status == PENDING and heir.receiver == item.receiver and heir.payload.get("group_key") == key:
                self.items[heir.id] = replace(
                    heir,
                    attempts=max(heir.attempts, item.attempts + 1),
                    next_attempt_at=max(heir.next_attempt_at, next_attempt_at),
                    last_error=error,
                )

    def mark_failed(self, item_id: int, error: str) -> None:
        if item := self._pending(item_id):
            self.items[item_id] = replace(item, status=FAILED, attempts=item.attempts + 1, last_error=error)


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: attempt ``n`` waits ``min(max_s, initial_s * factor**(n-1))``, less up to
    ``jitter`` of it at random; a ``Retry-After`` is honoured up to ``max_retry_after_s``."""

    initial_s: float = 10.0
    factor: float = 2.0
    max_s: float = 600.0
    jitter: float = 0.5
    max_attempts: int = 20
    max_retry_after_s: float = 3600.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        base = min(self.max_s, self.initial_s * self.factor ** max(0, attempt - 1))
        return base * (1.0 - self.jitter * rng.random())


@dataclass
class DeliveryCounts:
    sent: int = 0
    retried: int = 0
    failed: int = 0
    deferred: int = 0  # skipped this run because their receiver just failed
    cut_short: bool = False  # the run's deadline passed (or a stop was asked) with items left


class Delivery:
    """Delivers the outbox's due notifications through the receivers' notifiers."""

    def __init__(
        self,
        outbox: OutboxStore,
        notifiers: Mapping[str, Notifier],
        *,
        clock: Clock,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        batch: int = 100,
    ) -> None:
        self._outbox = outbox
        self._notifiers = dict(notifiers)
        self._clock = clock
        self._backoff = backoff or Backoff()
        self._rng = rng or random.Random()  # noqa: S311  (jitter, not cryptography)
        self._batch = batch

    def now(self) -> float:
        return self._clock.now()

    def next_attempt_at(self) -> float | None:
        return self._outbox.next_attempt_at()

    def run_due(
        self,
        now: float | None = None,
        *,
        deadline: float | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> DeliveryCounts:
        """Attempt every due item once (at most ``batch``), in order. ``deadline`` (``time.monotonic()``): take no
        new item after it; ``should_stop``: asked before each item."""
        fixed_now = now
        counts = DeliveryCounts()
        failing: set[str] = set()
        start = self._clock.now() if now is None else now
        due = self._outbox.due(start, self._batch)
        waiting = self._incident_queue(start) if any(_about_incidents(i) for i in due) else {}
        for item in due:
            if (deadline is not None and time.monotonic() >= deadline) or (should_stop is not None and should_stop()):
                counts.cut_short = True
                break
            now = self._clock.now() if fixed_now is None else fixed_now
            ahead = waiting.get(item.receiver, [])
            if item.receiver in failing or (_about_incidents(item) and ahead and ahead[0] < item.id):
                counts.deferred += 1
                continue
            outcome = self._deliver(item, now)
            if outcome != PENDING and item.id in ahead:
                ahead.remove(item.id)  # sent or given up: the next of its receiver's incident messages may go
            if outcome == SENT:
                counts.sent += 1
            elif outcome == FAILED:
                counts.failed += 1
            else:
                counts.retried += 1
                failing.add(item.receiver)
        return counts

    def _incident_queue(self, now: float) -> dict[str, list[int]]:
        """Receiver -> its pending incident messages, oldest first: each waits until those before it are sent. A
        message about several incidents is superseded by no newer one about one of them, so a stale FIRING is kept
        from arriving after the RESOLVED that followed it by waiting instead."""
        out: dict[str, list[int]] = {}
        for item in self._outbox.due(now + _FOREVER_S, self._batch * 10):
            if _about_incidents(item):
                out.setdefault(item.receiver, []).append(item.id)
        return {receiver: sorted(ids) for receiver, ids in out.items()}

    def _deliver(self, item: OutboxItem, now: float) -> str:
        notifier = self._notifiers.get(item.receiver)
        if notifier is None:
            return self._give_up(item, f"no receiver named {item.receiver!r} in the config")
        try:
            note = Notification.from_payload(item.payload)
        except ValueError as exc:
            return self._give_up(item, str(exc))
        try:
            notifier.send(
                note.alerts,
                group_labels=note.group_labels,
                status=note.status,
                group_key=note.group_key,
                incidents=note.incidents,
            )
        except DeliveryError as exc:
            attempts = item.attempts + 1
            if not exc.retryable or attempts >= self._backoff.max_attempts:
                reason = exc.message if not exc.retryable else f"{exc.message} (gave up after {attempts} attempts)"
                return self._give_up(item, reason)
            if exc.retry_after_s is not None:
                delay = min(exc.retry_after_s, self._backoff.max_retry_after_s)
            else:
                delay = self._backoff.delay(attempts, self._rng)
            self._outbox.mark_retry(item.id, now + delay, exc.message)
            log.warning("notification %d: %s; retrying in %.0f s (attempt %d)", item.id, exc.message, delay, attempts)
            return PENDING
        self._outbox.mark_sent(item.id, now)
        return SENT

    def _give_up(self, item: OutboxItem, reason: str) -> str:
        self._outbox.mark_failed(item.id, reason)
        log.error("notification %d to receiver %s dropped: %s", item.id, item.receiver, reason)
        return FAILED


_FOREVER_S: Final = 100 * 365 * 86400.0  # how far ahead ``_held`` looks for pending items: all of them


def _about_incidents(item: OutboxItem) -> bool:
    """A message about one incident or several (``alerts.incidentnotify``: ``incident:<id>``, ``incidents:<ids>``)."""
    return str(item.payload.get("group_key", "")).startswith("incident")
