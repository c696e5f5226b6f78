"""Slack incoming webhooks: a Block Kit message per notification, coloured by severity, within Slack's limits.

Each alert shows its summary; then what the on-call engineer reads first: the description, the ``cause``, the
``stuck_ranks`` and the ``fabric`` evidence when the alert carries them, and the rule's advice (``runbook``); then its
severity, node(s), GPU, job and value, and a link to its dashboard page. A resolved notification says so in green.

Slack refuses (HTTP 400) a message over its documented limits: 3,000 characters per section text, 2,000 per field,
10 fields per section, 150 per header, 50 blocks. So every text is escaped first and then cut to its share, between
words or list items and never inside an ``&amp;`` entity, ending in "and N more"; mrkdwn text objects are
``verbatim`` (no auto-linked ``@here`` or channel names from job names). A 400 all the same is not a silent drop:
it is logged once per receiver and a shorter message (the summaries only) is sent in its place. Slack answers ``ok``
with 200 on success; 429 carries ``Retry-After``.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from gpulens.alerts.base import dashboard_link
from gpulens.alerts.notify import DeliveryError, HttpPost, SecretSource, as_source, one_line, post, urllib_post
from gpulens.alerts.notify.incidentmsg import incident_message, incidents_message, is_incident
from gpulens.alerts.state import FIRING, RESOLVED, AlertState
from gpulens.config import format_timestamp
from gpulens.logutil import LogOnce

log = logging.getLogger(__name__)

COLOURS: Final = {"critical": "#d93025", "warning": "#f29900", "info": "#1a73e8", RESOLVED: "#188038"}
_SEVERITY_ORDER: Final = ("critical", "warning", "info")
_FIELD_LABELS: Final = (
    ("severity", "Severity"),
    ("node", "Node"),
    ("nodes", "Nodes"),
    ("gpu", "GPU"),
    ("job_id", "Job"),
    ("signature", "Signature"),
)

# Slack's documented limits (Block Kit reference: section, header and message).
SECTION_TEXT_MAX: Final = 3000
FIELD_TEXT_MAX: Final = 2000
FIELDS_MAX: Final = 10
HEADER_TEXT_MAX: Final = 150
BLOCKS_MAX: Final = 50
BLOCKS_PER_ALERT: Final = 4  # summary, details, fields, link

# The details of one alert, in the order shown, each with its share of the section's 3,000 characters.
DETAIL_LINES: Final = (
    ("description", "", 1000),
    ("cause", "*Cause:* ", 300),
    ("stuck_ranks", "*Stuck ranks:* ", 600),
    ("fabric", "*Fabric:* ", 450),
    ("runbook", "*Do:* ", 550),
)
SHORT_SUMMARY_MAX: Final = 300  # each summary in the shorter message sent after a 400
DONE_MAX: Final = 90  # what remediation did about the alert, after the details (their shares leave 100)

_TOKENS: Final = re.compile(r"[^\s,]+[\s,]*|[\s,]+")


def _escape(text: str) -> str:
    """Slack mrkdwn control characters."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _more(left: int) -> str:
    return f" … and {left} more"


def fit(text: str, limit: int) -> str:
    """``text`` escaped for mrkdwn in at most ``limit`` characters. A longer one is cut between words or list items
    and ends in "… and N more" (N words or items left out); a single word longer than the limit is cut between
    characters (N characters). An entity such as ``&amp;`` is never cut."""
    escaped = _escape(text)
    if len(escaped) <= limit:
        return escaped
    tokens = _TOKENS.findall(text)
    kept: list[str] = []
    size = 0
    for i, token in enumerate(tokens):
        piece = _escape(token)
        if size + len(piece) + len(_more(len(tokens) - i - 1)) > limit:
            break
        kept.append(piece)
        size += len(piece)
    if kept:
        return "".join(kept).rstrip(" ,\n\t") + _more(len(tokens) - len(kept))
    # Hand-written, not textwrap: textwrap knows neither the escaped widths nor the entities.
    chars: list[str] = []
    size = 0
    for j, char in enumerate(text):
        piece = _escape(char)
        if size + len(piece) + len(_more(len(text) - j - 1)) > limit:
            break
        chars.append(piece)
        size += len(piece)
    return "".join(chars) + _more(len(text) - len(chars))


def _mrkdwn(text: str) -> dict[str, Any]:
    return {"type": "mrkdwn", "text": text, "verbatim": True}


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
        remediation: Callable[[AlertState], str] | None = None,
    ) -> None:
        """``remediation``: what the remediation actions did about an alert, one line ("" for nothing), shown as
        "Done:" (the alert service reads it from the store's audit)."""
        self.name = name
        self.remediation = remediation
        self._url = as_source(url_source)
        self._dashboard_url = dashboard_url
        self._timeout_s = timeout_s
        self._http = http
        self._max_alerts = max(1, min(max_alerts, (BLOCKS_MAX - 2) // BLOCKS_PER_ALERT))
        self._log_once = LogOnce(log)
        self.shortened = 0  # messages Slack refused and that were sent shorter

    def send(
        self,
        alerts: Sequence[AlertState],
        *,
        group_labels: Mapping[str, str],
        status: str,
        group_key: str = "",
        incidents: Sequence[Mapping[str, str]] = (),
    ) -> None:
        try:
            self._post(self.render(alerts, group_labels=group_labels, status=status, incidents=incidents))
        except DeliveryError as exc:
            if exc.status != 400:
                raise
            self.shortened += 1
            self._log_once(
                "shortened",
                "%s; Slack refused the message (a size limit), so a shorter one with the summaries only is sent "
                "instead (logged once per receiver)",
                exc.message,
            )
            try:
                self._post(
                    self.render(alerts, group_labels=group_labels, status=status, short=True, incidents=incidents)
                )
            except DeliveryError as again:
                if again.status != 400:
                    raise
                raise DeliveryError(f"{again.message} (also for the shortened message)", retryable=False) from None

    def _post(self, message: dict[str, Any]) -> None:
        body = json.dumps(message).encode()
        headers = {"Content-Type": "application/json", "User-Agent": "gpulens"}
        response = post(self.name, self._url, body, headers, self._timeout_s, self._http)
        answer = response.body.decode("utf-8", "replace").strip()
        if answer and answer != "ok":
            raise DeliveryError(f"receiver {self.name}: Slack answered: {one_line(answer, 100)}", retryable=False)

    # ------------------------------------------------------------------------------------------ rendering

    def render(
        self,
        alerts: Sequence[AlertState],
        *,
        group_labels: Mapping[str, str],
        status: str,
        short: bool = False,
        incidents: Sequence[Mapping[str, str]] = (),
    ) -> dict[str, Any]:
        """The message body: a fallback ``text`` and one attachment of Block Kit blocks with the colour bar.
        ``short``: the summaries only (sent after Slack refused the full message)."""
        firing = [a for a in alerts if a.state == FIRING]
        resolved = [a for a in alerts if a.state == RESOLVED]
        if incidents or is_incident(group_labels):  # incidents (``alerts.incidentnotify``)
            most = 3 if short else 10
            text, parts = (
                incidents_message(alerts, incidents, status, fit=fit, max_alerts=most)
                if incidents
                else incident_message(alerts, group_labels, status, fit=fit, max_alerts=most)
            )
            attachment = {"color": self._colour(firing), "blocks": parts}
            return {"text": fit(text, SECTION_TEXT_MAX), "attachments": [attachment]}
        title = self._title(firing, resolved, group_labels, status)
        header = title if len(title) <= HEADER_TEXT_MAX else title[: HEADER_TEXT_MAX - 1] + "…"
        blocks: list[dict[str, Any]] = [{"type": "header", "text": {"type": "plain_text", "text": header}}]
        shown = (firing + resolved)[: self._max_alerts]
        for alert in shown:
            blocks.extend(self._short_blocks(alert) if short else self._alert_blocks(alert))
        hidden = len(firing) + len(resolved) - len(shown)
        if hidden > 0:
            blocks.append({"type": "context", "elements": [_mrkdwn(f"and {hidden} more")]})
        attachment = {"color": self._colour(firing), "blocks": blocks}
        return {"text": fit(title, SECTION_TEXT_MAX), "attachments": [attachment]}

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

    @staticmethod
    def _mark(alert: AlertState) -> str:
        return "Resolved" if alert.state == RESOLVED else alert.severity.capitalize() or "Firing"

    def _short_blocks(self, alert: AlertState) -> list[dict[str, Any]]:
        text = f"*{self._mark(alert)}:* {fit(alert.summary or alert.rule, SHORT_SUMMARY_MAX)}"
        return [{"type": "section", "text": _mrkdwn(text)}]

    def _alert_blocks(self, alert: AlertState) -> list[dict[str, Any]]:
        mark = f"*{self._mark(alert)}:* "
        summary = fit(alert.summary or alert.rule, SECTION_TEXT_MAX - len(mark))
        blocks: list[dict[str, Any]] = [{"type": "section", "text": _mrkdwn(mark + summary)}]
        details = [
            prefix + fit(text, share - len(prefix))
            for key, prefix, share in DETAIL_LINES
            if (text := alert.annotations.get(key, "").strip())
        ]
        done = self._done(alert)
        if done:
            details.append("*Done:* " + fit(done, DONE_MAX))
        if details:
            blocks.append({"type": "section", "text": _mrkdwn("\n".join(details))})
        fields = [
            _mrkdwn(f"*{title}*\n{fit(alert.labels[key], FIELD_TEXT_MAX - len(title) - 3)}")
            for key, title in _FIELD_LABELS
            if alert.labels.get(key)
        ]
        fields.append(_mrkdwn(f"*Value*\n{_value_text(alert.value)}"))
        fields.append(_mrkdwn(f"*Began*\n{format_timestamp(alert.began)}"))  # the fault's start, before it fired
        blocks.append({"type": "section", "fields": fields[:FIELDS_MAX]})
        link = self._link(alert)
        if link:
            blocks.append({"type": "context", "elements": [_mrkdwn(f"<{link}|Open in the gpulens dashboard>")]})
        return blocks

    def _done(self, alert: AlertState) -> str:
        if self.remediation is None:
            return ""
        try:
            return self.remediation(alert)
        except Exception as exc:  # noqa: BLE001 -- the message goes out without it; logged once
            self._log_once("remediation", "the remediation line of a Slack message is left out: %s", exc)
            return ""

    def _link(self, alert: AlertState) -> str | None:
        link = alert.annotations.get("dashboard")
        if not (link and link.startswith(("http://", "https://"))):
            link = dashboard_link(self._dashboard_url, alert.labels, "job" if "gpu" not in alert.labels else "gpu")
            if not self._dashboard_url:
                return None
        if link is None or len(link) > FIELD_TEXT_MAX or any(c in link for c in "<>|\n"):
            return None  # a link Slack's <url|text> syntax cannot carry
        return link
