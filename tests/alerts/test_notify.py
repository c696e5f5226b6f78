"""Notifiers against a real HTTP server on 127.0.0.1 that plays Slack and a webhook receiver, and the delivery stage.

The server follows a script: statuses (500, 429 with Retry-After, 404), a handler that sleeps past the client's
timeout; a closed port plays a refused connection. Delivery runs on a manual clock. The receiver URL is a secret:
no log record, error or exception chain may contain it.
"""

from __future__ import annotations

import base64
import json
import logging
import random
import socket
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from gpulens.alerts.grouping import Notification
from gpulens.alerts.notify import (
    DeliveryError,
    env_secret,
    file_secret,
    probe_notification,
    retry_after_seconds,
)
from gpulens.alerts.notify.delivery import FAILED, PENDING, SENT, Backoff, Delivery, InMemoryOutbox
from gpulens.alerts.notify.slack import COLOURS, SlackNotifier
from gpulens.alerts.notify.webhook import ZERO_TIME, WebhookNotifier
from gpulens.alerts.state import FIRING, RESOLVED, AlertState, fingerprint
from gpulens.clock import ManualClock
from gpulens.httpfetch import redact_secret_url, scrub

SECRET = "T0000/B0000/s3cr3tT0ken"


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Script:
    """Responses to play in order, then 200 "ok": (status, headers, body) or ("sleep", seconds)."""

    steps: list[tuple[Any, ...]] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next(self) -> tuple[Any, ...]:
        with self.lock:
            return self.steps.pop(0) if self.steps else (200, {}, b"ok")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    script: Script

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out closed its socket: nothing to report."""


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        script = self.server.script
        with script.lock:
            script.requests.append(Request(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        step = script.next()
        if step[0] == "sleep":
            time.sleep(step[1])
            step = (200, {}, b"ok")
        status, headers, payload = step
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@pytest.fixture
def server() -> Iterator[tuple[str, Script]]:
    script = Script()
    httpd = _Server(("127.0.0.1", 0), _Handler)
    httpd.script = script
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/services/{SECRET}", script
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


@pytest.fixture
def refused_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/services/{SECRET}"


def alert(state: str = FIRING, severity: str = "critical", **labels: str) -> AlertState:
    full = {"alertname": "GpuLost", "severity": severity, "node": "node-01", "gpu": "3", "uuid": "GPU-abc", **labels}
    return AlertState(
        fingerprint=fingerprint(full),
        rule=full["alertname"],
        labels=full,
        annotations={
            "summary": "GPU node-01:3 (job llm, user alice): lost <really>",
            "description": "d",
            "dashboard": "https://gpulens.example/gpus/GPU-abc",
        },
        state=state,
        active_since=1_767_225_600.0,
        fired_at=1_767_225_660.0,
        resolved_at=1_767_226_200.0 if state == RESOLVED else None,
        value=0.5,
    )


def note(
    *alerts: AlertState, receiver: str = "ops", status: str = FIRING, group: str = 'key{alertname="GpuLost"}'
) -> Notification:
    return Notification(receiver, group, {"alertname": "GpuLost"}, status, alerts, 0.0)


# ------------------------------------------------------------------------------------------------ Slack


def test_slack_block_kit_message(server: tuple[str, Script]) -> None:
    url, script = server
    slack = SlackNotifier(env_secret("SLACK_URL", {"SLACK_URL": url}), name="ops-slack")
    slack.send([alert(job_id="llm", user="alice")], group_labels={"alertname": "GpuLost"}, status=FIRING)
    [request] = script.requests
    assert request.path == f"/services/{SECRET}"
    assert request.headers["content-type"] == "application/json"
    body = request.json()
    assert body["text"] == "[FIRING:1] GpuLost"
    [attachment] = body["attachments"]
    assert attachment["color"] == COLOURS["critical"]
    header, summary, details, facts, link = attachment["blocks"]
    assert header == {"type": "header", "text": {"type": "plain_text", "text": "[FIRING:1] GpuLost"}}
    assert summary["text"]["text"] == "*Critical:* GPU node-01:3 (job llm, user alice): lost &lt;really&gt;"
    assert summary["text"]["verbatim"] is True  # no auto-linked @here or #channel from a label
    assert details["text"]["text"] == "d"
    fields = {f["text"].split("\n")[0]: f["text"].split("\n")[1] for f in facts["fields"]}
    assert fields == {
        "*Severity*": "critical",
        "*Node*": "node-01",
        "*GPU*": "3",
        "*Job*": "llm",
        "*Value*": "0.5",
        "*Began*": "2026-01-01T00:00:00Z",  # when the fault began (active_since here), not when it fired (00:01)
    }
    assert link["elements"][0]["text"] == "<https://gpulens.example/gpus/GPU-abc|Open in the gpulens dashboard>"


def test_slack_resolved_message_is_green(server: tuple[str, Script]) -> None:
    url, script = server
    SlackNotifier(url).send([alert(RESOLVED)], group_labels={}, status=RESOLVED)
    body = script.requests[0].json()
    assert body["text"] == "[RESOLVED] GpuLost"
    assert body["attachments"][0]["color"] == COLOURS[RESOLVED]
    assert body["attachments"][0]["blocks"][1]["text"]["text"].startswith("*Resolved:*")


def test_slack_colour_is_the_worst_severity_and_long_groups_are_cut() -> None:
    slack = SlackNotifier("http://unused.invalid/x", max_alerts=2)
    alerts = [alert(severity="info", gpu=str(i)) for i in range(3)] + [alert(severity="warning", gpu="9")]
    body = slack.render(alerts, group_labels={}, status=FIRING)
    assert body["attachments"][0]["color"] == COLOURS["warning"]
    assert body["attachments"][0]["blocks"][-1]["elements"][0]["text"] == "and 2 more"


def test_slack_ok_body_is_required(server: tuple[str, Script]) -> None:
    url, script = server
    script.steps.append((200, {}, b"invalid_blocks"))
    with pytest.raises(DeliveryError) as err:
        SlackNotifier(url, name="s").send([alert()], group_labels={}, status=FIRING)
    assert not err.value.retryable


# ------------------------------------------------------------------------------------------------ webhook


def test_webhook_sends_the_alertmanager_v4_payload(server: tuple[str, Script]) -> None:
    url, script = server
    hook = WebhookNotifier(url, name="am", external_url="https://gpulens.example", bearer_source=lambda: "tok3n")
    # the first fault began 30 s before its condition held (a hang's first stalled round)
    alerts = [replace(alert(), began_at=1_767_225_570.0), alert(RESOLVED, gpu="4", uuid="GPU-def")]
    hook.send(alerts, group_labels={"alertname": "GpuLost"}, status=FIRING, group_key="k1")
    [request] = script.requests
    assert request.headers["authorization"] == "Bearer tok3n"
    body = request.json()
    assert body["version"] == "4"
    assert body["groupKey"] == "k1"
    assert body["status"] == "firing"
    assert body["receiver"] == "am"
    assert body["groupLabels"] == {"alertname": "GpuLost"}
    assert body["commonLabels"] == {"alertname": "GpuLost", "severity": "critical", "node": "node-01"}
    assert body["commonAnnotations"]["description"] == "d"
    assert body["externalURL"] == "https://gpulens.example"
    first, second = body["alerts"]
    assert set(first) == {
        "status",
        "labels",
        "annotations",
        "startsAt",
        "beganAt",
        "endsAt",
        "generatorURL",
        "fingerprint",
    }
    assert (first["status"], first["startsAt"], first["endsAt"]) == ("firing", "2026-01-01T00:01:00Z", ZERO_TIME)
    assert first["beganAt"] == "2025-12-31T23:59:30Z"  # when the fault began, before it fired (startsAt)
    assert second["beganAt"] == "2026-01-01T00:00:00Z"  # no earlier start known: when its condition first held
    assert first["generatorURL"] == "https://gpulens.example/gpus/GPU-abc"
    assert first["fingerprint"] == fingerprint(first["labels"])
    assert (second["status"], second["endsAt"]) == ("resolved", "2026-01-01T00:10:00Z")


def test_webhook_basic_auth(server: tuple[str, Script], tmp_path) -> None:
    url, script = server
    password = tmp_path / "password"
    password.write_text("pa55\n")
    WebhookNotifier(url, username="gpulens", password_source=file_secret(password)).send(
        [alert()], group_labels={}, status=FIRING
    )
    auth = script.requests[0].headers["authorization"]
    assert base64.b64decode(auth.removeprefix("Basic ")) == b"gpulens:pa55"


# ------------------------------------------------------------------------------------------------ failures


@pytest.mark.parametrize(
    ("step", "retryable", "retry_after"),
    [
        ((500, {}, b"oops"), True, None),
        ((503, {}, b""), True, None),
        ((429, {"Retry-After": "7"}, b"rate_limited"), True, 7.0),
        ((404, {}, f"no_service for /services/{SECRET}".encode()), False, None),
        ((400, {}, b"invalid_payload"), False, None),
        (("sleep", 0.5), True, None),
    ],
)
def test_failures_are_typed_and_never_show_the_url(
    server: tuple[str, Script], step: tuple[Any, ...], retryable: bool, retry_after: float | None
) -> None:
    url, script = server
    script.steps.extend([step, step] if step[0] == 400 else [step])  # a 400 is tried again shorter, once
    with pytest.raises(DeliveryError) as err:
        SlackNotifier(url, name="ops", timeout_s=0.1).send([alert()], group_labels={}, status=FIRING)
    assert err.value.retryable is retryable
    assert err.value.retry_after_s == retry_after
    assert_no_secret(err.value, url)
    assert "receiver ops (http://127.0.0.1:" in str(err.value)


def test_refused_connection_is_retryable(refused_url: str) -> None:
    with pytest.raises(DeliveryError) as err:
        WebhookNotifier(refused_url, name="am").send([alert()], group_labels={}, status=FIRING)
    assert err.value.retryable
    assert "cannot connect" in str(err.value)
    assert_no_secret(err.value, refused_url)


def test_missing_url_variable_is_a_clear_permanent_error() -> None:
    with pytest.raises(DeliveryError, match="SLACK_URL is not set") as err:
        SlackNotifier(env_secret("SLACK_URL", {})).send([alert()], group_labels={}, status=FIRING)
    assert not err.value.retryable


def assert_no_secret(error: BaseException, url: str) -> None:
    """Neither the error, its chain nor its formatted traceback holds the URL or its token."""
    text = "".join(traceback.format_exception(error))
    seen: BaseException | None = error
    while seen is not None:
        text += str(seen) + repr(seen)
        seen = seen.__cause__ or seen.__context__
    assert url not in text
    assert "s3cr3tT0ken" not in text


def test_redact_and_scrub() -> None:
    url = f"https://hooks.slack.com/services/{SECRET}?x=1"
    assert redact_secret_url(url) == "https://hooks.slack.com/***"
    assert scrub(f"failed: {url} and /services/{SECRET}", url) == "failed: *** and ***"
    assert retry_after_seconds("12") == 12.0
    assert retry_after_seconds("Thu, 01 Jan 2026 00:01:00 GMT", now=1_767_225_600.0) == 60.0
    assert retry_after_seconds("soon") is None


# ------------------------------------------------------------------------------------------------ delivery


class Receivers:
    """A delivery stage over an in-memory outbox, a manual clock and seeded jitter."""

    def __init__(self, notifiers: dict[str, Any], backoff: Backoff | None = None) -> None:
        self.outbox = InMemoryOutbox()
        self.clock = ManualClock(1_767_225_600.0)
        self.delivery = Delivery(
            self.outbox, notifiers, clock=self.clock, backoff=backoff or Backoff(), rng=random.Random(1)
        )

    def enqueue(self, receiver: str = "ops", group: str = 'key{alertname="GpuLost"}') -> int:
        """A notification of ``group``: a later one of the same group and receiver supersedes it."""
        return self.outbox.enqueue(receiver, note(alert(), receiver=receiver, group=group).payload(), self.clock.now())

    def item(self, item_id: int):
        return self.outbox.items[item_id]


def test_delivery_retries_5xx_with_growing_backoff_then_succeeds(server: tuple[str, Script]) -> None:
    url, script = server
    script.steps += [(500, {}, b""), (502, {}, b""), (503, {}, b"")]
    r = Receivers({"ops": SlackNotifier(url, name="ops")})
    item = r.enqueue()
    waits = []
    for _ in range(3):
        before = r.clock.now()
        counts = r.delivery.run_due()
        assert counts.retried == 1
        waits.append(r.item(item).next_attempt_at - before)
        assert r.delivery.run_due().retried == 0  # not due yet: nothing is attempted
        r.clock.set(r.item(item).next_attempt_at)
    assert 5.0 <= waits[0] <= 10.0
    assert 10.0 <= waits[1] <= 20.0
    assert 20.0 <= waits[2] <= 40.0
    assert r.delivery.run_due().sent == 1
    assert (r.item(item).status, r.item(item).attempts) == (SENT, 4)
    assert len(script.requests) == 4


def test_delivery_waits_for_retry_after_on_429(server: tuple[str, Script]) -> None:
    url, script = server
    script.steps.append((429, {"Retry-After": "30"}, b"rate_limited"))
    r = Receivers({"ops": SlackNotifier(url, name="ops")})
    item = r.enqueue()
    r.delivery.run_due()
    assert r.item(item).next_attempt_at == r.clock.now() + 30.0
    r.clock.advance(29.0)
    assert r.delivery.run_due().sent == 0
    r.clock.advance(1.0)
    assert r.delivery.run_due().sent == 1


def test_delivery_gives_up_on_4xx_with_one_logged_error(
    server: tuple[str, Script], caplog: pytest.LogCaptureFixture
) -> None:
    url, script = server
    script.steps.append((404, {}, b"no_service"))
    r = Receivers({"ops": SlackNotifier(url, name="ops")})
    item = r.enqueue()
    with caplog.at_level(logging.DEBUG):
        counts = r.delivery.run_due()
        r.clock.advance(3600.0)
        r.delivery.run_due()
    assert (counts.failed, r.item(item).status, len(script.requests)) == (1, FAILED, 1)
    errors = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert "HTTP 404" in errors[0].getMessage()


def test_delivery_retries_timeouts_and_refused_connections(server: tuple[str, Script], refused_url: str) -> None:
    url, script = server
    script.steps.append(("sleep", 0.5))
    r = Receivers({"slow": SlackNotifier(url, name="slow", timeout_s=0.1), "down": WebhookNotifier(refused_url)})
    slow, down = r.enqueue("slow"), r.enqueue("down")
    counts = r.delivery.run_due()
    assert counts.retried == 2
    assert r.item(slow).status == r.item(down).status == PENDING
    assert "timed out" in str(r.item(slow).last_error)
    assert "cannot connect" in str(r.item(down).last_error)
    r.clock.advance(60.0)
    assert r.delivery.run_due().sent == 1  # the slow one answers now; the refused one retries again


def test_a_failing_receiver_defers_its_other_items_and_spares_the_rest(refused_url: str, server) -> None:
    url, _ = server
    r = Receivers({"down": WebhookNotifier(refused_url), "ops": SlackNotifier(url, name="ops")})
    downs = [r.enqueue("down", group=f"g{i}") for i in range(5)]
    ok = r.enqueue("ops")
    counts = r.delivery.run_due()
    assert (counts.retried, counts.deferred, counts.sent) == (1, 4, 1)
    assert r.item(ok).status == SENT
    assert [r.item(i).attempts for i in downs] == [1, 0, 0, 0, 0]  # no storm: one attempt per run


def test_delivery_gives_up_after_max_attempts(refused_url: str, caplog: pytest.LogCaptureFixture) -> None:
    r = Receivers({"down": WebhookNotifier(refused_url)}, Backoff(max_attempts=3))
    item = r.enqueue("down")
    with caplog.at_level(logging.ERROR):
        for _ in range(3):
            r.delivery.run_due()
            r.clock.advance(3600.0)
    assert (r.item(item).status, r.item(item).attempts) == (FAILED, 3)
    assert "gave up after 3 attempts" in str(r.item(item).last_error)
    assert len([rec for rec in caplog.records if rec.levelno >= logging.ERROR]) == 1


def test_unknown_receiver_and_bad_payload_fail(caplog: pytest.LogCaptureFixture) -> None:
    r = Receivers({})
    unknown = r.enqueue("gone")
    bad = r.outbox.enqueue("gone", {"nonsense": True}, r.clock.now())
    r.delivery.run_due()
    assert r.item(unknown).status == r.item(bad).status == FAILED
    assert "no receiver named 'gone'" in str(r.item(unknown).last_error)


def test_pending_items_survive_a_restart(server: tuple[str, Script]) -> None:
    """At-least-once: a new delivery stage (a restarted collector) picks up what the old one left."""
    url, script = server
    script.steps.append((500, {}, b""))
    r = Receivers({"ops": SlackNotifier(url, name="ops")})
    item = r.enqueue()
    r.delivery.run_due()
    restarted = Delivery(r.outbox, {"ops": SlackNotifier(url, name="ops")}, clock=r.clock)
    r.clock.advance(3600.0)
    assert restarted.run_due().sent == 1
    assert r.item(item).status == SENT
    assert len(script.requests) == 2


def test_the_url_never_reaches_a_log_record(server: tuple[str, Script], refused_url: str, caplog) -> None:
    url, script = server
    script.steps += [(500, {}, b""), (429, {"Retry-After": "1"}, b""), (404, {}, f"/services/{SECRET}".encode())]
    script.steps.append(("sleep", 0.5))
    r = Receivers(
        {
            "ops": SlackNotifier(env_secret("U", {"U": url}), name="ops", timeout_s=0.1),
            "down": WebhookNotifier(refused_url, name="down"),
        }
    )
    for i in range(4):
        r.enqueue("ops", group=f"g{i}")
    r.enqueue("down")
    with caplog.at_level(logging.DEBUG):
        for _ in range(8):
            r.delivery.run_due()
            r.clock.advance(3600.0)
    assert caplog.records
    for record in caplog.records:
        text = record.getMessage() + (logging.Formatter().formatException(record.exc_info) if record.exc_info else "")
        assert "s3cr3tT0ken" not in text
        assert url not in text
    for item in r.outbox.items.values():
        assert "s3cr3tT0ken" not in str(item.last_error)


def test_probe_notification_reaches_a_webhook(server: tuple[str, Script]) -> None:
    url, script = server
    probe = probe_notification("am", 1_767_225_600.0)
    hook = WebhookNotifier(url, name="am")
    hook.send(probe.alerts, group_labels=probe.group_labels, status=probe.status, group_key=probe.group_key)
    [sent] = script.requests[0].json()["alerts"]
    assert sent["labels"] == {"alertname": "GpulensTestNotification", "severity": "info"}
    assert "receiver am" in sent["annotations"]["summary"]


def test_a_receiver_echoing_only_its_token_never_gets_it_into_output_log_or_outbox(
    server: tuple[str, Script], caplog: pytest.LogCaptureFixture
) -> None:
    """A receiver answers 403 with the webhook URL's last path segment alone: every place that echoes the answer
    (the error, the log, the outbox's last error) shows it hidden."""
    url, script = server
    token = SECRET.rsplit("/", 1)[-1]
    script.steps += [(403, {}, f"invalid_token {token} (team T0000)".encode())] * 2
    r = Receivers({"ops": SlackNotifier(url, name="ops")})
    item = r.enqueue()
    with caplog.at_level(logging.DEBUG):
        counts = r.delivery.run_due()
    with pytest.raises(DeliveryError) as err:
        SlackNotifier(url, name="ops").send([alert()], group_labels={}, status=FIRING)
    stored = r.item(item).last_error or ""
    assert counts.failed == 1
    assert "invalid_token" in stored  # the answer is kept, for the operator...
    for text in (stored, str(err.value), *(rec.getMessage() for rec in caplog.records)):
        assert token not in text  # ...but never the token
        assert "B0000" not in text


def test_scrub_hides_each_piece_of_a_secret_url() -> None:
    url = "https://hooks.example.com/services/T0000/B0000/xoxFAKEtoken?sig=abcdef123&v=1"
    text = "403 invalid_token xoxFAKEtoken sig=abcdef123 path /services/T0000/B0000/xoxFAKEtoken"
    scrubbed = scrub(text, url)
    for piece in ("xoxFAKEtoken", "abcdef123", "T0000/B0000"):
        assert piece not in scrubbed
    assert scrubbed.startswith("403 invalid_token ***")
