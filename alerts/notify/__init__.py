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
    "post",
    "probe_notification",
    "retry_after_seconds",
    "urllib_post",
]

SecretSource = Callable[[], str]
MAX_RESPONSE_BYTES = 64 * 1024


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
    ) -> None:
        """Deliver once. Raises ``DeliveryError``; its message never contains the receiver's URL."""
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
    statuses are not. Messages name the receiver and the redacted URL only.
    """
    url = url_source()
    where = f"receiver {receiver} ({redact_secret_url(url)})"
    try:
        response = http(url, body, headers, timeout_s)
    except TimeoutError:
        raise DeliveryError(f"{where}: timed out after {timeout_s:g} s", retryable=True) from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        text = "timed out" if isinstance(reason, TimeoutError) else str(reason) or type(reason).__name__
        raise DeliveryError(scrub(f"{where}: cannot connect: {text}", url, *secrets), retryable=True) from None
    except (OSError, HTTPException) as exc:
        text = str(exc) or type(exc).__name__
        raise DeliveryError(scrub(f"{where}: {text}", url, *secrets), retryable=True) from None
    except ValueError as exc:
        raise DeliveryError(scrub(f"{where}: {exc}", url, *secrets), retryable=False) from None
    status = response.status
    if 200 <= status < 300:
        return response
    detail = response.body[:200].decode("utf-8", "replace").strip()
    message = scrub(f"{where}: HTTP {status}" + (f": {detail}" if detail else ""), url, *secrets)
    if status == 429:
        retry_after = retry_after_seconds(response.headers.get("retry-after"))
        raise DeliveryError(message, retryable=True, retry_after_s=retry_after, status=status)
    raise DeliveryError(message, retryable=status >= 500 or status == 408, status=status)
