"""Generic webhooks: Alertmanager's version-4 payload, so gpulens feeds Alertmanager, PagerDuty bridges or any tool.

The URL (and the optional basic-auth password or bearer token) are secrets, read at send time and kept out of
every error message.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from gpulens.alerts.notify import HttpPost, SecretSource, as_source, post, urllib_post
from gpulens.alerts.state import RESOLVED, AlertState
from gpulens.config import format_timestamp

# Alertmanager's "no end yet" time, sent as endsAt of a firing alert.
ZERO_TIME: Final = "0001-01-01T00:00:00Z"


def _common(mappings: list[Mapping[str, str]]) -> dict[str, str]:
    """The pairs every mapping shares."""
    if not mappings:
        return {}
    first = mappings[0]
    return {k: v for k, v in first.items() if all(m.get(k) == v for m in mappings[1:])}


def alertmanager_alert(alert: AlertState) -> dict[str, Any]:
    """One alert in Alertmanager's webhook format."""
    started = alert.fired_at if alert.fired_at is not None else alert.active_since
    resolved = alert.state == RESOLVED and alert.resolved_at is not None
    return {
        "status": "resolved" if alert.state == RESOLVED else "firing",
        "labels": dict(alert.labels),
        "annotations": dict(alert.annotations),
        "startsAt": format_timestamp(started),
        "beganAt": format_timestamp(alert.began),  # when the fault began (a hang's first stalled round), not fired
        "endsAt": format_timestamp(alert.resolved_at) if resolved and alert.resolved_at is not None else ZERO_TIME,
        "generatorURL": alert.annotations.get("dashboard", ""),
        "fingerprint": alert.fingerprint,
    }


def alertmanager_payload(
    alerts: Sequence[AlertState],
    *,
    receiver: str,
    group_labels: Mapping[str, str],
    status: str,
    group_key: str,
    external_url: str = "",
    incidents: Sequence[Mapping[str, str]] = (),
) -> dict[str, Any]:
    """The version-4 webhook payload (docs/domain.md §6); a message about several incidents adds ``incidents``, each
    one's verdict as a single incident's message has it in ``groupLabels``."""
    extra = {"incidents": [dict(i) for i in incidents]} if incidents else {}
    return {
        "version": "4",
        "groupKey": group_key,
        "truncatedAlerts": 0,
        "status": "firing" if status != RESOLVED else "resolved",
        "receiver": receiver,
        "groupLabels": dict(group_labels),
        "commonLabels": _common([a.labels for a in alerts]),
        "commonAnnotations": _common([a.annotations for a in alerts]),
        "externalURL": external_url,
        "alerts": [alertmanager_alert(a) for a in alerts],
        **extra,
    }


class WebhookNotifier:
    """POSTs the Alertmanager v4 payload to a URL, with optional basic auth or a bearer token."""

    def __init__(
        self,
        url_source: str | SecretSource,
        *,
        name: str = "webhook",
        external_url: str = "",
        timeout_s: float = 10.0,
        http: HttpPost = urllib_post,
        username: str | None = None,
        password_source: SecretSource | None = None,
        bearer_source: SecretSource | None = None,
    ) -> None:
        if password_source is not None and bearer_source is not None:
            raise ValueError("give basic auth or a bearer token, not both")
        self.name = name
        self._url = as_source(url_source)
        self._external_url = external_url
        self._timeout_s = timeout_s
        self._http = http
        self._username = username
        self._password = password_source
        self._bearer = bearer_source

    def render(
        self,
        alerts: Sequence[AlertState],
        *,
        group_labels: Mapping[str, str],
        status: str,
        group_key: str = "",
        incidents: Sequence[Mapping[str, str]] = (),
    ) -> dict[str, Any]:
        return alertmanager_payload(
            alerts,
            receiver=self.name,
            group_labels=group_labels,
            status=status,
            group_key=group_key,
            external_url=self._external_url,
            incidents=incidents,
        )

    def send(
        self,
        alerts: Sequence[AlertState],
        *,
        group_labels: Mapping[str, str],
        status: str,
        group_key: str = "",
        incidents: Sequence[Mapping[str, str]] = (),
    ) -> None:
        payload = self.render(
            alerts, group_labels=group_labels, status=status, group_key=group_key, incidents=incidents
        )
        self._post(json.dumps(payload).encode())

    def _post(self, body: bytes, url: SecretSource | None = None) -> None:
        """POST a JSON body with the receiver's credentials (to ``url``, or to the receiver's URL)."""
        headers = {"Content-Type": "application/json", "User-Agent": "gpulens"}
        secrets: list[str] = []
        if self._bearer is not None:
            token = self._bearer()
            secrets.append(token)
            headers["Authorization"] = f"Bearer {token}"
        elif self._password is not None:
            password = self._password()
            secrets.append(password)
            pair = f"{self._username or ''}:{password}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
        post(self.name, url or self._url, body, headers, self._timeout_s, self._http, secrets=secrets)
