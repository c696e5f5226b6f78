"""Alerts (``/alerts``): what fires and what is pending now, what fired in the range, and the silences. Each alert
links to the node, GPU and job it is about.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from dash import Dash, Output, State, html

from gpulens.alerts.state import AlertState, Silence
from gpulens.dashboard import ids
from gpulens.dashboard.alertdata import counts_as_firing
from gpulens.dashboard.alertdetail import alert_detail
from gpulens.dashboard.components import (
    Cell,
    ViewState,
    banner,
    flag,
    link,
    page_header,
    panel,
    register_page,
    register_toolbar,
    table,
    toolbar_inputs,
    view_state,
)
from gpulens.dashboard.context import Context, PageError, guarded
from gpulens.dashboard.flags import alert_jobs
from gpulens.dashboard.formatting import MISSING, duration_text
from gpulens.dashboard.paths import gpu_path, job_path, node_path
from gpulens.dashboard.silenceform import silence_form
from gpulens.dashboard.timerange import minute_text, resolve_range
from gpulens.dashboard.unavailable import Missing, attempt, not_available

PATH: Final = "/alerts"
IDS: Final = ids.ALERTS
_SEVERITY_ORDER: Final = {"critical": 0, "warning": 1, "info": 2}


def layout(**query: Any) -> html.Div:
    state = ViewState.from_query(query)
    return html.Div(
        [
            page_header("Alerts", "firing and pending now, history in the range, silences", IDS, state),
            html.Div(id=IDS.status),
            panel("Now", html.Div(id=ids.ALERTS_ACTIVE)),
            panel("History", html.Div(id=ids.ALERTS_HISTORY)),
            panel("Silences", html.Div(id=ids.ALERTS_SILENCES)),
            panel("Drain actions", html.Div(id=ids.ALERTS_DRAINS)),
        ]
    )


def register(app: Dash, context: Context) -> None:
    register_page(__name__, path=PATH, title="Alerts · gpulens", name="Alerts", layout=layout)
    register_toolbar(app, IDS)

    @app.callback(
        Output(IDS.status, "children"),
        Output(ids.ALERTS_ACTIVE, "children"),
        Output(ids.ALERTS_HISTORY, "children"),
        Output(ids.ALERTS_SILENCES, "children"),
        Output(ids.ALERTS_DRAINS, "children"),
        Output(IDS.updated, "children"),
        *toolbar_inputs(IDS),
        State(IDS.refresh, "value"),
    )
    def update(range_: str, start: str, end: str, _tick: int | None, refresh: str) -> tuple[Any, ...]:
        state = view_state(range_, start, end, refresh)
        try:
            return render(context, state)
        except PageError as problem:
            return problem.banner, None, None, None, None, problem.as_of


def render(context: Context, state: ViewState) -> tuple[Any, ...]:
    now = context.clock.now()

    reader = context.alerts

    def load() -> tuple[Any, ...]:
        span = resolve_range(state.range, state.start, state.end, now, history_start=context.history_start(state.range))
        drains = attempt(context.store.drain_actions)
        if reader is None:
            return span, [], [], [], drains
        return span, reader.active(), reader.history(span.start, span.end), reader.silences(now), drains

    span, active, history, silences, drains = guarded(context, load)
    if reader is None:
        note = " Alerts are evaluated by the collector's alert engine; this dashboard was started without its store."
        no_store = banner("info", "No alert store connected.", note)
        return no_store, None, None, None, _drains(drains, state), f"as of {minute_text(now)}"
    firing = [a for a in active if counts_as_firing(a)]
    status = None
    if firing:
        critical = sum(1 for a in firing if a.labels.get("severity") == "critical")
        status = banner("bad" if critical else "warn", f"{len(firing)} alert(s) firing", f"({critical} critical).")
    ordered = sorted(
        active,
        key=lambda a: (
            a.state != "firing",
            _SEVERITY_ORDER.get(a.labels.get("severity", ""), 9),
            -(a.fired_at or a.active_since),
        ),
    )
    return (
        status,
        alerts_table(ordered, state, empty="nothing firing or pending", now=now),
        alerts_table(fired_newest_first(history), state, empty="no alert fired in this range"),
        html.Div([silences_table(silences, now), silence_form()]),
        _drains(drains, state),
        f"as of {minute_text(now)} · {span.label}",
    )


def related_alerts(alerts: Sequence[AlertState] | None, state: ViewState, now: float) -> html.Div:
    """The node or GPU page's alerts: its own and its jobs' (``GpuView.related``), or that no store is connected."""
    if alerts is None:
        return html.Div("no alert store connected", className="gl-empty")
    return alerts_table(alerts, state, empty="no alert about it or its jobs fired in this range", now=now)


def fired_newest_first(episodes: Sequence[AlertState]) -> list[AlertState]:
    """The episodes that fired (pending ones that cleared are noise in a history), the latest first."""
    fired = [e for e in episodes if e.fired_at is not None]
    return sorted(fired, key=lambda e: -(e.fired_at or 0.0))


def subject_links(labels: Mapping[str, str], state: ViewState) -> html.Span:
    """Links to what an alert is about: its GPU (and node), or its node, and its job(s)."""
    parts: list[Any] = []
    node = labels.get("node")
    if labels.get("uuid"):
        parts.append(link(f"{node or '?'}:{labels.get('gpu', '?')}", gpu_path(labels["uuid"]), state))
        if node:
            parts += [" on ", link(node, node_path(node), state)]
    elif node:
        parts.append(link(node, node_path(node), state))
    for job in alert_jobs(labels):
        parts += [" · " if parts else "", "job ", link(job, job_path(job), state)]
    return html.Span(parts or [MISSING])


def alerts_table(alerts: Sequence[AlertState], state: ViewState, *, empty: str, now: float | None = None) -> html.Div:
    """One row per alert: state, severity, name, what it is about (links), its summary (which opens onto its
    description and runbook), when its fault began and since when it fires."""
    rows: list[list[Cell]] = []
    for a in alerts:
        since = a.fired_at if a.fired_at is not None else a.active_since
        ended = a.resolved_at
        when = minute_text(since)
        if ended is not None:
            when += f" → {minute_text(ended)} ({duration_text(ended - since)})"
        elif now is not None:
            when += f" ({duration_text(now - since)})"
        state_flags = [flag(a.state)]
        if a.muted:
            state_flags.append(flag(a.muted, "silenced"))
        rows.append(
            [
                html.Span(state_flags),
                flag(a.labels.get("severity", MISSING), a.labels.get("severity")),
                html.Strong(a.rule),
                subject_links(a.labels, state),
                alert_detail(a),
                minute_text(a.began),
                when,
            ]
        )
    columns = ["state", "severity", "alert", "about", "summary (click: description, runbook)", "began", "fired"]
    return table(columns, rows, empty=empty, limit=100)


def silences_table(silences: Sequence[Silence], now: float) -> html.Div:
    rows: list[list[Cell]] = [
        [
            flag("active" if s.starts_at <= now < s.ends_at else "pending", "silenced"),
            html.Span(", ".join(str(m) for m in s.matchers), className="mono"),
            f"{minute_text(s.starts_at)} → {minute_text(s.ends_at)}",
            s.created_by or MISSING,
            s.comment or "",
        ]
        for s in silences
    ]
    return table(["state", "matchers", "from → to", "by", "comment"], rows, empty="no silence active or scheduled")


def _drains(drains: Sequence[Mapping[str, Any]] | Missing, state: ViewState) -> html.Div | None:
    """The drain actions, or the line saying that the store keeps none."""
    return not_available([drains]) if isinstance(drains, Missing) else drains_table(drains, state)


def drains_table(drains: Sequence[Mapping[str, Any]], state: ViewState) -> html.Div:
    """The slurm-drain actions' latest decisions, taken or refused (``[[alerts.actions]]``), newest first."""
    rows: list[list[Cell]] = [
        [
            minute_text(float(d["time"])),
            flag(str(d["outcome"]), "firing" if d["outcome"] in ("drained", "failed") else None),
            link(str(d["node"]), node_path(str(d["node"])), state),
            str(d["gpu"]) or MISSING,
            html.Span(str(d["rule"]), className="mono"),
            str(d["reason"]),
        ]
        for d in drains
    ]
    return table(["when", "outcome", "node", "GPU", "rule", "reason"], rows, empty="no drain action", limit=50)
