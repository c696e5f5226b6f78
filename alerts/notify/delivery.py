"""The one retry stage: a durable outbox of notifications and the loop that delivers what is due.

Notifications are written to the outbox in the same round that decides them, and marked sent only after their
receiver accepted them, so delivery is at-least-once across restarts. A retryable failure (5xx, timeout, connection
error) is retried with exponential backoff and jitter; a 429 waits for its ``Retry-After``; anything else gives up at
once with one logged error. After a retryable failure the run skips that receiver's other items, and a run delivers
at most ``batch`` items, so a receiver that is down is not stormed when it comes back.

``OutboxStore`` is the protocol the SQL outbox in ``storage/`` implements; ``InMemoryOutbox`` is the same for tests
and ``gpulens simulate``.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from alerts.grouping import Notification
from gpulens.clock import Clock

from . import DeliveryError, Notifier

log = logging.getLogger(__name__)

PENDING = "pending"
SENT = "sent"
FAILED = "failed"


@dataclass(frozen=True)
class OutboxItem:
    id: int
    receiver: str
    payload: Mapping[str, Any]
    attempts: int = 0
    created_at: float = 0.0
    next_attempt_at: float = 0.0
    status: str = PENDING  # "pending" | "sent" | "failed"
    last_error: str | None = None


class OutboxStore(Protocol):
    """Durable storage of notifications waiting to be delivered."""

    def enqueue(self, receiver: str, payload: Mapping[str, Any], now: float) -> int:
        """Store a notification, due at once; returns its id."""
        ...

    def due(self, now: float, limit: int) -> list[OutboxItem]:
        """Pending items whose next attempt is due, oldest first."""
        ...

    def mark_sent(self, item_id: int, now: float) -> None: ...

    def mark_retry(self, item_id: int, next_attempt_at: float, error: str) -> None:
        """Count a failed attempt and schedule the next one."""
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
        self.items[item_id] = OutboxItem(item_id, receiver, dict(payload), created_at=now, next_attempt_at=now)
        return item_id

    def due(self, now: float, limit: int) -> list[OutboxItem]:
        ready = [i for i in self.items.values() if i.status == PENDING and i.next_attempt_at <= now]
        return sorted(ready, key=lambda i: (i.next_attempt_at, i.id))[:limit]

    def mark_sent(self, item_id: int, now: float) -> None:
        item = self.items[item_id]
        self.items[item_id] = replace(item, status=SENT, attempts=item.attempts + 1)

    def mark_retry(self, item_id: int, next_attempt_at: float, error: str) -> None:
        item = self.items[item_id]
        self.items[item_id] = replace(
            item, attempts=item.attempts + 1, next_attempt_at=next_attempt_at, last_error=error
        )

    def mark_failed(self, item_id: int, error: str) -> None:
        item = self.items[item_id]
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

    def run_due(self, now: float | None = None) -> DeliveryCounts:
        """Attempt every due item once (at most ``batch``), in order."""
        now = self._clock.now() if now is None else now
        counts = DeliveryCounts()
        failing: set[str] = set()
        for item in self._outbox.due(now, self._batch):
            if item.receiver in failing:
                counts.deferred += 1
                continue
            outcome = self._deliver(item, now)
            if outcome == SENT:
                counts.sent += 1
            elif outcome == FAILED:
                counts.failed += 1
            else:
                counts.retried += 1
                failing.add(item.receiver)
        return counts

    def _deliver(self, item: OutboxItem, now: float) -> str:
        notifier = self._notifiers.get(item.receiver)
        if notifier is None:
            return self._give_up(item, f"no receiver named {item.receiver!r} in the config")
        try:
            note = Notification.from_payload(item.payload)
        except ValueError as exc:
            return self._give_up(item, str(exc))
        try:
            notifier.send(note.alerts, group_labels=note.group_labels, status=note.status, group_key=note.group_key)
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
