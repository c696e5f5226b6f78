"""Receivers that misbehave, against the delivery stage: an error body that tries to forge log lines, and an
Alertmanager that hangs past the next resend (its failures keep their backoff). Real HTTP servers on 127.0.0.1, a
manual clock, no jitter."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping

import pytest

from gpulens.alerts.notify import HttpResponse, Notifier, one_line, probe_notification, urllib_post
from gpulens.alerts.notify.alertmanager import AlertmanagerNotifier
from gpulens.alerts.notify.delivery import PENDING, SUPERSEDED, Backoff, Delivery, InMemoryOutbox, OutboxStore
from gpulens.alerts.notify.slack import SlackNotifier
from gpulens.alerts.notify.webhook import WebhookNotifier
from gpulens.alerts.service import SqlOutbox
from gpulens.clock import ManualClock
from gpulens.storage import alertstore
from gpulens.storage.db import Database
from tests.alerts.receivers import answering_receiver, hanging_receiver
from tests.storage.conftest import _pg_root, clock, db, db_url, pg_server

__all__ = ["_pg_root", "clock", "db", "db_url", "pg_server"]  # the storage tests' fixtures

T0 = 1_767_225_600.0
FORGERY = b"bad\nFORGED gpulens line\r\n2026-01-01 00:00:00 ERROR forged too\x1b[2J"


def test_one_line_escapes_breaks_and_controls_and_bounds_the_length() -> None:
    assert one_line("bad\nFORGED\r\tx\\y") == "bad\\nFORGED\\r\\tx\\\\y"
    assert one_line("\x1b[2J\x00\u2028\u0085 é ok") == "\\x1b[2J\\x00\\u2028\\x85 é ok"
    assert one_line("x" * 200) == "x" * 200
    cut = one_line("\n" * 300)
    assert len(cut) <= 200
    assert cut.endswith("\\n...")  # cut between escapes, never inside one


NOTIFIERS: dict[str, Callable[[str], Notifier]] = {
    "webhook": lambda url: WebhookNotifier(url, name="hook"),
    "slack": lambda url: SlackNotifier(url, name="hook"),
    "alertmanager": lambda url: AlertmanagerNotifier(url, name="hook"),
}


@pytest.mark.parametrize("kind", sorted(NOTIFIERS))
def test_a_receivers_error_body_stays_on_one_log_line(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    with answering_receiver(500, FORGERY) as url:
        outbox = InMemoryOutbox()
        clock = ManualClock(T0)
        delivery = Delivery(outbox, {"hook": NOTIFIERS[kind](url)}, clock=clock, rng=random.Random(1))
        item = outbox.enqueue("hook", probe_notification("hook", T0).payload(), T0)
        with caplog.at_level(logging.DEBUG, logger="gpulens"):
            assert delivery.run_due().retried == 1
    [record] = caplog.records
    line = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s").format(record)
    assert not {"\n", "\r", "\x1b"} & set(line)
    assert "HTTP 500: bad\\nFORGED gpulens line\\r\\n2026-01-01" in line
    assert "\n" not in str(outbox.items[item].last_error)


# ------------------------------------------------------------------------------------------------ a hanging receiver

IN_FLIGHT_S = 5.0  # the resend falls this far into the hanging send (the receiver's timeout is 10 s in production)


def resend_while_in_flight(outbox: OutboxStore, clock: ManualClock, sends: list[bool]) -> Callable[..., HttpResponse]:
    """The HTTP POST of the notifier: for each ``True`` in ``sends``, the engine's next resend of the group is
    enqueued while the request is in flight (the clock at the resend), as the collector's round does on its thread."""

    def http(url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> HttpResponse:
        if sends.pop(0):
            clock.advance(IN_FLIGHT_S)
            outbox.enqueue("am", probe_notification("am", T0).payload(), clock.now())
        return urllib_post(url, body, headers, timeout_s)

    return http


def pending(outbox: OutboxStore) -> list[tuple[int, float]]:
    """(attempts, next attempt time) of the pending items."""
    return [(i.attempts, i.next_attempt_at) for i in outbox.due(float("inf"), 100)]


def check_backoff_carries_over(outbox: OutboxStore, caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock(T0)
    with hanging_receiver() as url:
        http = resend_while_in_flight(outbox, clock, [True, True, False])
        notifier = AlertmanagerNotifier(url, name="am", timeout_s=0.2, http=http, clock=clock.now)
        delivery = Delivery(outbox, {"am": notifier}, clock=clock, backoff=Backoff(initial_s=10.0, jitter=0.0))
        outbox.enqueue("am", probe_notification("am", T0).payload(), T0)
        schedule = []
        with caplog.at_level(logging.WARNING, logger="gpulens.alerts.notify.delivery"):
            for _ in range(3):
                started = clock.now()
                assert delivery.run_due().retried == 1
                [(attempts, next_at)] = pending(outbox)
                schedule.append((attempts, next_at - started))
                clock.set(next_at)
    # Each failure counts and doubles the wait from the send that failed, whether or not a resend superseded the item
    # while it hung (the resend would be due at once, 5 s into the send: its heir keeps the later time).
    assert schedule == [(1, 10.0), (2, 20.0), (3, 40.0)]
    messages = [r.getMessage() for r in caplog.records]
    assert [m.split("timed out after 0.2 s; ")[1] for m in messages] == [
        "retrying in 10 s (attempt 1)",
        "retrying in 20 s (attempt 2)",
        "retrying in 40 s (attempt 3)",
    ]


def test_a_hanging_alertmanager_keeps_its_backoff_across_resends_in_memory(caplog: pytest.LogCaptureFixture) -> None:
    check_backoff_carries_over(InMemoryOutbox(), caplog)


def test_a_hanging_alertmanager_keeps_its_backoff_across_resends_in_sql(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    check_backoff_carries_over(SqlOutbox(db), caplog)
    statuses = [i.status for i in alertstore.outbox_items(db)]
    assert statuses == [SUPERSEDED, SUPERSEDED, PENDING]
