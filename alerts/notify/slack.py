"""Slack incoming webhooks: a Block Kit message per notification, coloured by severity.

Each alert shows its summary, then its severity, node, GPU, job and value, and a link to its dashboard page; a
resolved notification says so in green. Slack answers ``ok`` with 200 on success; 429 carries ``Retry-After``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from gpulens.alerts.base import dashboard_link
from gpulens.alerts.notify import DeliveryError, HttpPost, SecretSource, as_source, post, urllib_post
from gpulens.alerts.state import FIRING, RESOLVED, AlertState

COLOURS: Final = {"critical": "#d93025", "warning": "#f29900", "info": "#1a73e8", RESOLVED: "#188038"}
_SEVERITY_ORDER: Final = ("critical", "warning", "info")
_FIELD_LABELS: Final = (("severity", "Severity"), ("node", "Node"), ("gpu", "GPU"), ("job_id", "Job"))


def _escape(text: str) -> str:
    """Slack mrkdwn control characters."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _value_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


class SlackNotifier:
    """Posts notifications to a Slack incoming webhook whose URL is a secret (read from ``url_source`` per send)."""

    def __init__(
        self,
        url_source: str | SecretSource,
        *,
        name: str = "slack",
        dashboard_url: str | None = None,
        timeout_s: float = 10.0,
        http: HttpPost = urllib_post,
        max_alerts: int = 10,
    ) -> None:
        self.name = name
        self._url = as_source(url_source)
        self._dashboard_url = dashboard_url
        self._timeout_s = timeout_s
        self._http = http
        self._max_alerts = max_alerts

    def send(
        self,
        alerts: Sequence[AlertState],
        *,
        group_labels: Mapping[str, str],
        status: str,
        group_key: str = "",
    ) -> None:
        body = json.dumps(self.render(alerts, group_labels=group_labels, status=status)).encode()
        headers = {"Content-Type": "application/json", "User-Agent": "gpulens"}
        response = post(self.name, self._url, body, headers, self._timeout_s, self._http)
        answer = response.body.decode("utf-8", "replace").strip()
        if answer and answer != "ok":
            raise DeliveryError(f"receiver {self.name}: Slack answered {answer[:100]!r}", retryable=False)

    # ------------------------------------------------------------------------------------------ rendering

    def render(self, alerts: Sequence[AlertState], *, group_labels: Mapping[str, str], status: str) -> dict[str, Any]:
        """The message body: a fallback ``text`` and one attachment of Block Kit blocks with the colour bar."""
        firing = [a for a in alerts if a.state == FIRING]
        resolved = [a for a in alerts if a.state == RESOLVED]
        title = self._title(firing, resolved, group_labels, status)
        blocks: list[dict[str, Any]] = [{"type": "header", "text": {"type": "plain_text", "text": title[:150]}}]
        shown = (firing + resolved)[: self._max_alerts]
        for alert in shown:
            blocks.extend(self._alert_blocks(alert))
        hidden = len(firing) + len(resolved) - len(shown)
        if hidden > 0:
            blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": f"and {hidden} more"}]})
        return {"text": title, "attachments": [{"color": self._colour(firing), "blocks": blocks}]}

    @staticmethod
    def _title(
        firing: list[AlertState], resolved: list[AlertState], group_labels: Mapping[str, str], status: str
    ) -> str:
        names = sorted({a.rule for a in firing or resolved}) or [group_labels.get("alertname", "alert")]
        what = ", ".join(names)
        if status == FIRING and firing:
            return f"[FIRING:{len(firing)}] {what}"
        return f"[RESOLVED] {what}"

    @staticmethod
    def _colour(firing: list[AlertState]) -> str:
        if not firing:
            return COLOURS[RESOLVED]
        worst = min(firing, key=lambda a: _SEVERITY_ORDER.index(a.severity) if a.severity in _SEVERITY_ORDER else 9)
        return COLOURS.get(worst.severity, COLOURS["info"])

    def _alert_blocks(self, alert: AlertState) -> list[dict[str, Any]]:
        mark = "Resolved" if alert.state == RESOLVED else alert.severity.capitalize() or "Firing"
        summary = alert.summary or alert.rule
        blocks: list[dict[str, Any]] = [
            {"type": "section", "text": {"type": "mrkdwn", "text": f"*{mark}:* {_escape(summary)}"}}
        ]
        fields = [
            {"type": "mrkdwn", "text": f"*{title}*\n{_escape(alert.labels[key])}"}
            for key, title in _FIELD_LABELS
            if alert.labels.get(key)
        ]
        fields.append({"type": "mrkdwn", "text": f"*Value*\n{_value_text(alert.value)}"})
        blocks.append({"type": "section", "fields": fields[:10]})
        link = self._link(alert)
        if link:
            blocks.append(
                {"type": "context", "elements": [{"type": "mrkdwn", "text": f"<{link}|Open in the gpulens dashboard>"}]}
            )
        return blocks

    def _link(self, alert: AlertState) -> str | None:
        link = alert.annotations.get("dashboard")
        if link and link.startswith(("http://", "https://")):
            return link
        if not self._dashboard_url:
            return None
        return dashboard_link(self._dashboard_url, alert.labels, "job" if "gpu" not in alert.labels else "gpu")
