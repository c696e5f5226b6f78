"""Incidents (``/incidents``): the first stop. The incidents open now, the most severe first, each with its culprit,
the jobs, users and GPUs it hurts, its action and runbook, when its fault began, and the timeline of its member
alerts; then those resolved in the range.
"""

from __future__ import annotations

from typing import Any, Final

from dash import Dash, Output, State, html

from gpulens.alerts.incidents import open_incidents
from gpulens.dashboard import ids
from gpulens.dashboard.components import (
    ViewState,
    banner,
    page_header,
    panel,
    register_page,
    register_toolbar,
    toolbar_inputs,
    view_state,
)
from gpulens.dashboard.context import Context, PageError, guarded
from gpulens.dashboard.incidentview import incident_reader, incidents_table
from gpulens.dashboard.timerange import minute_text, resolve_range

PATH: Final = "/incidents"
IDS: Final = ids.INCIDENTS


def layout(**query: Any) -> html.Div:
    state = ViewState.from_query(query)
    return html.Div(
        [
            page_header("Incidents", "one per fault: its culprit, the jobs it hurts, what to do", IDS, state),
            html.Div(id=IDS.status),
            panel("Open", html.Div(id=ids.INCIDENTS_OPEN)),
            panel("Resolved in the range", html.Div(id=ids.INCIDENTS_HISTORY)),
        ]
    )


def register(app: Dash, context: Context) -> None:
    register_page(__name__, path=PATH, title="Incidents · gpulens", name="Incidents", layout=layout)
    register_toolbar(app, IDS)

    @app.callback(
        Output(IDS.status, "children"),
        Output(ids.INCIDENTS_OPEN, "children"),
        Output(ids.INCIDENTS_HISTORY, "children"),
        Output(IDS.updated, "children"),
        *toolbar_inputs(IDS),
        State(IDS.refresh, "value"),
    )
    def update(range_: str, start: str, end: str, _tick: int | None, refresh: str) -> tuple[Any, ...]:
        state = view_state(range_, start, end, refresh)
        try:
            return render(context, state)
        except PageError as problem:
            return problem.banner, None, None, problem.as_of


def render(context: Context, state: ViewState) -> tuple[Any, ...]:
    now = context.clock.now()
    reader = incident_reader(context)
    if reader is None:
        note = " Incidents are formed by the alert engine; this dashboard was started without its store."
        return banner("info", "No alert store connected.", note), None, None, f"as of {minute_text(now)}"

    def load() -> tuple[Any, ...]:
        span = resolve_range(state.range, state.start, state.end, now, history_start=context.history_start(state.range))
        return span, reader.incidents(span.start)

    span, incidents = guarded(context, load)
    open_ = open_incidents({i.id: i for i in incidents})
    closed = [i for i in incidents if not i.is_open and (i.resolved_at or 0.0) <= span.end]
    status = None
    if open_:
        critical = sum(1 for i in open_ if i.severity == "critical")
        status = banner("bad" if critical else "warn", f"{len(open_)} incident(s) open", f"({critical} critical).")
    return (
        status,
        incidents_table(open_, state, now, empty="no open incident"),
        incidents_table(closed, state, now, empty="no incident resolved in this range"),
        f"as of {minute_text(now)} · {span.label}",
    )
