"""The silence form on the alerts page: an operator silences alerts from the dashboard; a viewer is refused.

The form posts to ``/silences`` (matchers as ``gpulens silence add`` takes them, comma-separated; a duration; a
comment). The server checks the visitor's role (``gpulens.webroles``: from the basic-auth file or the proxy's header)
and that the post comes from the dashboard's own page (its ``Origin`` or ``Referer``: a form on another site cannot
post with the visitor's credentials), then stores the silence where ``gpulens silence add`` would, and sends the
browser back to the alerts page. Refusals are one line of text: 403 for a viewer or a foreign page, 400 for a bad
field, 501 where the dashboard has no alert store to write to (over Prometheus).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from dash import Dash, dcc, html
from flask import Response, redirect, request

from gpulens.alerts.matchers import MatcherError, parse_matcher
from gpulens.clock import Clock
from gpulens.config import parse_duration
from gpulens.webauth import BasicAuth
from gpulens.webroles import OPERATOR, RolePolicy

# (matchers as JSON, starts_at, ends_at, comment, created_by) -> the new silence's id
SilenceWriter = Callable[[list[dict[str, Any]], float, float, str, str], int]

PATH: Final = "/silences"
MAX_FIELD: Final = 1000  # characters of a field: a bound on what one post may store


def silence_form() -> html.Form:
    """The form (shown to every visitor; the server decides who may use it)."""
    return html.Form(
        action=PATH,
        method="POST",
        className="gl-silence-form",
        children=[
            dcc.Input(name="matchers", type="text", placeholder="alertname=GpuMemorySaturated, node=gpu-07"),
            dcc.Input(name="duration", type="text", value="2h"),
            dcc.Input(name="comment", type="text", placeholder="why (shown to everyone)"),
            html.Button("Silence", type="submit"),
            html.Span(" operators only", className="gl-hint"),
        ],
    )


def install(
    app: Dash, *, write: SilenceWriter | None, policy: RolePolicy, auth: BasicAuth | None, clock: Clock
) -> None:
    """Serve ``POST /silences`` on ``app``'s server."""

    def post() -> Response:
        user = auth.check(request.headers.get("Authorization")) if auth is not None else None
        header = request.headers.get(policy.header) if policy.header else None
        if policy.role(user, header) != OPERATOR:
            return _text(403, "silencing needs the operator role; this visitor is a viewer")
        source = request.headers.get("Origin") or request.headers.get("Referer") or ""
        if not (source + "/").startswith(request.host_url.rstrip("/") + "/"):
            return _text(403, "a silence must be posted from the dashboard's own page")
        if write is None:
            return _text(501, "this dashboard has no alert store to keep silences in")
        try:
            matchers, seconds, comment = _fields(request.form)
        except ValueError as exc:
            return _text(400, str(exc))
        now = clock.now()
        write([m.to_json() for m in matchers], now, now + seconds, comment, user or "dashboard")
        return redirect("/alerts", code=303)  # type: ignore[return-value]

    app.server.add_url_rule(PATH, "gpulens_silence", post, methods=["POST"])


def _fields(form: Any) -> tuple[list[Any], float, str]:
    texts = {name: str(form.get(name, "")).strip() for name in ("matchers", "duration", "comment")}
    for name, text in texts.items():
        if not text:
            raise ValueError(f"{name}: required")
        if len(text) > MAX_FIELD:
            raise ValueError(f"{name}: longer than {MAX_FIELD} characters")
    try:
        matchers = [parse_matcher(item.strip()) for item in texts["matchers"].split(",") if item.strip()]
    except MatcherError as exc:
        raise ValueError(f"matchers: {exc}") from None
    try:
        seconds = parse_duration(texts["duration"])
    except (TypeError, ValueError) as exc:
        raise ValueError(f"duration: {exc}") from None
    if seconds <= 0:
        raise ValueError("duration: expected a positive duration like 2h")
    return matchers, seconds, texts["comment"]


def _text(status: int, line: str) -> Response:
    return Response(line + "\n", status=status, mimetype="text/plain")
