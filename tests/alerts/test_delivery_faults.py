"""Receivers that misbehave, against the delivery stage: an error body that tries to forge log lines. Real HTTP
servers on 127.0.0.1, a manual clock."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

import pytest

from gpulens.alerts.notify import Notifier, one_line, probe_notification
from gpulens.alerts.notify.alertmanager import AlertmanagerNotifier
from gpulens.alerts.notify.delivery import Delivery, InMemoryOutbox
from gpulens.alerts.notify.slack import SlackNotifier
from gpulens.alerts.notify.webhook import WebhookNotifier
from gpulens.clock import ManualClock
from tests.alerts.receivers import answering_receiver
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
