"""The notification worker: delivers the outbox on its own thread, so no receiver can hold up a scrape round.

The collector's round hook only evaluates the rules and writes what to send into the durable outbox, then wakes
the worker. The worker runs ``Delivery.run_due`` whenever it is woken and on a timer (the next retry that falls
due, at most ``poll_s`` away). Each pass is bounded twice: at most ``batch`` items (the delivery stage's), and a
deadline after which it stops taking new items and waits for the next pass; each send is bounded by its receiver's
own timeout. The outbox is the queue, so it is bounded by what the engine writes and survives restarts; nothing is
held in memory but a wake-up flag.

``stop`` returns within ``timeout_s`` (5 s by default) even when a send is in flight: after a second's grace the
send's socket is shut down (``gpulens.httpfetch.abort_requests``), and the item stays pending in the outbox,
to be sent again by the next process (at-least-once).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gpulens.alerts.notify.delivery import Delivery, DeliveryCounts
from gpulens.httpfetch import abort_requests
from gpulens.storage.db import DatabaseUnavailableError

log = logging.getLogger(__name__)

DEFAULT_POLL_S = 5.0
DEFAULT_DEADLINE_S = 30.0


class NotificationWorker:
    """One thread that delivers the outbox: woken by the round hook, and by a timer for retries."""

    def __init__(
        self,
        delivery: Delivery,
        *,
        poll_s: float = DEFAULT_POLL_S,
        deadline_s: float = DEFAULT_DEADLINE_S,
        name: str = "gpulens-notify",
        on_pass: Callable[[DeliveryCounts], None] | None = None,
    ) -> None:
        self._delivery = delivery
        self._poll_s = poll_s
        self._deadline_s = deadline_s
        self._name = name
        self._on_pass = on_pass
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._outbox_down = False

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Ask for a delivery pass now (new items in the outbox). Never blocks."""
        self._wake.set()

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Stop the thread; True if it ended within ``timeout_s``."""
        thread, self._thread = self._thread, None
        if thread is None:
            return True
        self._stop.set()
        self._wake.set()
        started = time.monotonic()
        thread.join(timeout=min(1.0, timeout_s / 2))
        if thread.is_alive():
            abort_requests(thread)  # a send in flight: cut it short, it stays pending in the outbox
        thread.join(timeout=max(0.0, timeout_s - (time.monotonic() - started)))
        if thread.is_alive():
            log.warning("notification worker still sending after %.0f s; left to finish on its own", timeout_s)
            return False
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            wait = self._poll_s
            try:
                deadline = time.monotonic() + self._deadline_s
                counts = self._delivery.run_due(deadline=deadline, should_stop=self._stop.is_set)
                if self._on_pass is not None:
                    self._on_pass(counts)
                if counts.cut_short:
                    wait = 0.0  # more is due: carry on after checking for a stop
                else:
                    next_at = self._delivery.next_attempt_at()
                    until = None if next_at is None else next_at - self._delivery.now()
                    if until is not None and until > 0:
                        wait = min(self._poll_s, until)
                    # else: nothing pending, or due items deferred because their receiver just failed: they wait
                    # for the next poll (or wake), so a receiver that is down gets one attempt per pass, not a storm
                if self._outbox_down:
                    log.info("notification outbox reachable again")
                    self._outbox_down = False
            except DatabaseUnavailableError as exc:
                if not self._outbox_down:
                    log.warning("notifications postponed: %s", exc)
                    self._outbox_down = True
            except Exception:
                log.exception("notification delivery pass failed")
            self._wake.wait(wait)
