"""Alertmanager as a receiver: gpulens's firing and resolved alerts POSTed to its ``/api/v2/alerts``, as Prometheus
sends them.

Each alert is rendered as the webhook payload renders it (``notify.webhook.alertmanager_alert``: labels, annotations,
``startsAt``, ``generatorURL`` into the dashboard), without the webhook's envelope. A firing alert's ``endsAt`` lies
``lease_s`` ahead of the send (Prometheus: 4 x max(resend delay, evaluation interval)), so Alertmanager resolves it
by itself should gpulens stop re-sending it; a resolved alert's ``endsAt`` is when it resolved. The re-sending itself
is the routing's: a route to an alertmanager receiver repeats every ``resend_interval`` (``alerts.config``). Requests
carry at most ``MAX_BATCH`` alerts (Prometheus's batch size). One notifier serves one URL: an HA pair's Alertmanagers
are separate outbox destinations, so one that is down delays no other.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from gpulens.alerts.notify import HttpPost, SecretSource, as_source, urllib_post
from gpulens.alerts.notify.webhook import WebhookNotifier, alertmanager_alert
from gpulens.alerts.state import RESOLVED, AlertState
from gpulens.config import format_timestamp

API_PATH: Final = "/api/v2/alerts"
MAX_BATCH: Final = 256
DEFAULT_RESEND_S: Final = 60.0
LEASE_FACTOR: Final = 4


def api_url(base: str) -> str:
    """The alerts endpoint of an Alertmanager given by its base URL (``http://am:9093``, or with a path prefix)."""
    base = base.strip().rstrip("/")
    return base if base.endswith(API_PATH) else base + API_PATH


def lease_s(resend_s: float, eval_interval_s: float) -> float:
    """How far ahead a firing alert's ``endsAt`` lies: 4 x max(resend interval, evaluation interval)."""
    return LEASE_FACTOR * max(resend_s, eval_interval_s)


def postable_alerts(
    alerts: Sequence[AlertState], *, now: float, lease_s: float, external_url: str = ""
) -> list[dict[str, Any]]:
    """The alerts as Alertmanager's API v2 takes them (``postableAlerts``)."""
    out = []
    for alert in alerts:
        doc = alertmanager_alert(alert)
        if alert.state == RESOLVED:
            ends = alert.resolved_at if alert.resolved_at is not None else now
        else:
            ends = now + lease_s
        out.append(
            {
                "labels": doc["labels"],
                "annotations": doc["annotations"],
                "startsAt": doc["startsAt"],
                "endsAt": format_timestamp(ends),
                "generatorURL": doc["generatorURL"] or external_url,
            }
        )
    return out


class AlertmanagerNotifier(WebhookNotifier):
    """POSTs alerts to one Alertmanager's ``/api/v2/alerts``, with optional basic auth or a bearer token."""

    def __init__(
        self,
        url_source: str | SecretSource,
        *,
        name: str = "alertmanager",
        external_url: str = "",
        timeout_s: float = 10.0,
        http: HttpPost = urllib_post,
        username: str | None = None,
        password_source: SecretSource | None = None,
        bearer_source: SecretSource | None = None,
        lease_s: float = LEASE_FACTOR * DEFAULT_RESEND_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        base = as_source(url_source)
        super().__init__(
            lambda: api_url(base()),
            name=name,
            external_url=external_url,
            timeout_s=timeout_s,
            http=http,
            username=username,
            password_source=password_source,
            bearer_source=bearer_source,
        )
        self._lease_s = lease_s
        self._clock = clock

    def send(
        self,
        alerts: Sequence[AlertState],
        *,
        group_labels: Mapping[str, str],
        status: str,
        group_key: str = "",
        incidents: Sequence[Mapping[str, str]] = (),
    ) -> None:
        """POST the alerts in batches; ``endsAt`` of the firing ones counts from now (a retried send renews it)."""
        docs = postable_alerts(alerts, now=self._clock(), lease_s=self._lease_s, external_url=self._external_url)
        for start in range(0, len(docs), MAX_BATCH):
            self._post(json.dumps(docs[start : start + MAX_BATCH]).encode())
