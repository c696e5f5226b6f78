"""Notifiers: the protocol, the typed delivery error, secret URLs and the HTTP POST they share.

A notifier renders a notification for one kind of receiver and sends it once. It does not retry: it raises
``DeliveryError`` saying whether a retry could help (and after how long, for a 429), and the shared delivery stage
(``alerts.notify.delivery``) decides. Receiver URLs are secrets (a Slack incoming-webhook URL is a bearer credential):
they come from an environment variable or a file, are read at send time so they can be rotated, and never appear in
an error or a log line; errors name the receiver and the URL's scheme and host only.
"""

from __future__ import annotations

import os
import ssl
import time
import urllib.error
from collections.abc import Callable, Mapping, Sequence
from email.utils import parsedate_to_datetime
from http.client import HTTPException
from pathlib import Path
from typing import Protocol

from gpulens.alerts.grouping import Notification
from gpulens.alerts.state import FIRING, AlertState, fingerprint
from gpulens.httpfetch import HttpResponse, redact_secret_url, request, scrub

__all__ = [
    "MAX_RESPONSE_BYTES",
    "DeliveryError",
    "HttpPost",
    "HttpResponse",
    "Notifier",
    "SecretSource",
    "as_source",
    "env_secret",
    "file_secret",
    "one_line",
    "post",
    "probe_notification",
    "retry_after_seconds",
    "urllib_post",
]

SecretSource = Callable[[], str]
MAX_RESPONSE_BYTES = 64 * 1024
MAX_DETAIL_CHARS = 200  # of a receiver's answer, quoted in an error
_NAMED_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


class DeliveryError(Exception):
    """A notification could not be delivered. ``retryable``: a later attempt may succeed."""

    def __init__(
        self, message: str, *, retryable: bool, retry_after_s: float | None = None, status: int | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.retry_after_s = retry_after_s
        self.status = status  # the receiver's HTTP status, when it answered


class Notifier(Protocol):
    """Sends one notification to one receiver."""

    name: str

    def send(
        self,
        alerts: Sequence[AlertState],
        *,
        group_labels: Mapping[str, str],
        status: str,
        group_key: str = "",
        incidents: Sequence[Mapping[str, str]] = (),
    ) -> None:
        """Deliver once (``incidents``: each incident's verdict, when the message is about several). Raises
        ``DeliveryError``; its message never contains the receiver's URL."""
        ...


def probe_notification(receiver: str, now: float) -> Notification:
    """A harmless notification for ``gpulens alerts test-notify RECEIVER``: one ``info`` alert, firing."""
    labels = {"alertname": "GpulensTestNotification", "severity": "info"}
    alert = AlertState(
        fingerprint=fingerprint(labels),
        rule=labels["alertname"],
        labels=labels,
        annotations={
            "summary": f"Test notification from gpulens to receiver {receiver}",
            "description": "Sent by `gpulens alerts test-notify`; nothing is wrong.",
        },
        state=FIRING,
        active_since=now,
        fired_at=now,
        last_seen=now,
    )
    return Notification(receiver, f"test:{receiver}", dict(labels), FIRING, (alert,), now)


# ------------------------------------------------------------------------------------------------ secrets


def env_secret(variable: str, environ: Mapping[str, str] | None = None) -> SecretSource:
    """A secret read from an environment variable at each use."""

    def read() -> str:
        value = (os.environ if environ is None else environ).get(variable, "").strip()
        if not value:
            raise DeliveryError(f"environment variable {variable} is not set", retryable=False)
        return value

    return read


def file_secret(path: str | Path) -> SecretSource:
    """A secret read from the first line of a file at each use (so it can be rotated)."""

    def read() -> str:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise DeliveryError(f"cannot read {path}: {exc.strerror or type(exc).__name__}", retryable=True) from None
        except UnicodeDecodeError:
            raise DeliveryError(f"cannot read {path}: not UTF-8 text", retryable=False) from None
        value = lines[0].strip() if lines else ""
        if not value:
            raise DeliveryError(f"{path} is empty", retryable=False)
        return value

    return read


def as_source(value: str | SecretSource) -> SecretSource:
    if callable(value):
        return value
    return lambda: value


# ------------------------------------------------------------------------------------------------ HTTP


def one_line(text: str, limit: int = MAX_DETAIL_CHARS) -> str:
    """``text`` as one line of at most ``limit`` characters, for an error or a log line: a backslash, a line break
    and every other character that ``str.isprintable`` refuses (controls, ``\\u2028``, ...) escaped as ``repr``
    escapes them, and a longer text cut (never inside an escape) with ``...``. A receiver's answer goes through it, so
    it cannot start a log line of its own."""
    pieces = [_escaped(char) for char in text]
    if sum(len(p) for p in pieces) <= limit:
        return "".join(pieces)
    out: list[str] = []
    size = 0
    for piece in pieces:
        if size + len(piece) > limit - len("..."):
            break
        out.append(piece)
        size += len(piece)
    return "".join(out) + "..."


def _escaped(char: str) -> str:
    if char in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[char]
    if char.isprintable():
        return char
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


HttpPost = Callable[[str, bytes, Mapping[str, str], float], HttpResponse]


def urllib_post(
    url: str, body: bytes, headers: Mapping[str, str], timeout_s: float, context: ssl.SSLContext | None = None
) -> HttpResponse:
    """POST through ``gpulens.httpfetch.request``: proxies from the environment, no redirects, the whole exchange
    within ``timeout_s``, the answer's first ``MAX_RESPONSE_BYTES``. Raises ``OSError``/``HTTPException`` (and
    ``TimeoutError``) on transport failures; any HTTP status is returned, not raised."""
    return request(
        url,
        method="POST",
        data=body,
        headers=headers,
        timeout_s=timeout_s,
        max_bytes=MAX_RESPONSE_BYTES,
        truncate=True,
        error_body_bytes=MAX_RESPONSE_BYTES,
        proxies=True,
        context=context,
    )


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """A ``Retry-After`` header (seconds or an HTTP date) as seconds from now."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def post(
    receiver: str,
    url_source: SecretSource,
    body: bytes,
    headers: Mapping[str, str],
    timeout_s: float,
    http: HttpPost,
    *,
    secrets: Sequence[str] = (),
) -> HttpResponse:
    """POST ``body`` to the receiver's secret URL; a 2xx response is returned, anything else is a ``DeliveryError``.

    5xx, 408, timeouts and connection failures are retryable; 429 is retryable after its ``Retry-After``; other
    statuses are not. Messages name the receiver and the redacted URL only, and quote the receiver's answer (its
    first 200 characters) through ``one_line``.
    """
    url = url_source()
    where = f"receiver {receiver} ({redact_secret_url(url)})"

    def quote(text: str) -> str:
        """What the receiver or the transport said: its secrets scrubbed, then on one bounded line."""
        return one_line(scrub(text, url, *secrets))

    try:
        response = http(url, body, headers, timeout_s)
    except TimeoutError:
        raise DeliveryError(f"{where}: timed out after {timeout_s:g} s", retryable=True) from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        text = "timed out" if isinstance(reason, TimeoutError) else str(reason) or type(reason).__name__
        raise DeliveryError(f"{where}: cannot connect: {quote(text)}", retryable=True) from None
    except (OSError, HTTPException) as exc:
        raise DeliveryError(f"{where}: {quote(str(exc) or type(exc).__name__)}", retryable=True) from None
    except ValueError as exc:
        raise DeliveryError(f"{where}: {quote(str(exc))}", retryable=False) from None
    status = response.status
    if 200 <= status < 300:
        return response
    detail = quote(response.body.decode("utf-8", "replace").strip())
    message = f"{where}: HTTP {status}" + (f": {detail}" if detail else "")
    if status == 429:
        retry_after = retry_after_seconds(response.headers.get("retry-after"))
        raise DeliveryError(message, retryable=True, retry_after_s=retry_after, status=status)
    raise DeliveryError(message, retryable=status >= 500 or status == 408, status=status)
