"""Incidents on the dashboard: the table of incidents (culprit, blast radius, action and runbook, age, the timeline of
member alerts) that the Incidents page shows, and the panel of the incidents that touch one node, GPU or job, which
the overview, node, GPU and job pages show with a callback of its own (``incident_panel`` in the layout,
``register_incident_panel`` beside the page's callback).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from dash import Dash, Input, Output, State, dcc, html

from gpulens.alerts.incidents import Incident
from gpulens.dashboard.alertdata import AlertReader
from gpulens.dashboard.components import Cell, ViewState, flag, link, panel, table, view_state
from gpulens.dashboard.context import Context, PageError, guarded
from gpulens.dashboard.formatting import MISSING, duration_text
from gpulens.dashboard.ids import Toolbar
from gpulens.dashboard.paths import gpu_path, job_path, node_path
from gpulens.dashboard.timerange import minute_text
from gpulens.storage.reading import NotAvailableOnBackend

MAX_ROWS: Final = 50


def incident_reader(context: Context) -> AlertReader | None:
    """The alert store the incidents are read from; ``None`` without one (a read it cannot serve raises
    ``NotAvailableOnBackend``, which the callers catch)."""
    return context.alerts


def culprit_cell(inc: Incident, state: ViewState) -> html.Span:
    """The culprit, linked to its page: a GPU, a node (a port's, a rank's), a job."""
    c = inc.culprit
    parts: list[Any] = [flag(c.kind, "culprit"), " "]
    if c.kind == "gpu" and c.uuid:
        parts.append(link(c.text, gpu_path(c.uuid), state))
    elif c.kind == "job" and c.job_id:
        parts.append(link(c.text, job_path(c.job_id), state))
    elif c.node:
        parts.append(link(c.text, node_path(c.node), state))
    else:
        parts.append(c.text)
    if c.pci:
        parts.append(html.Span(f" {c.pci}", className="mono"))
    return html.Span(parts)


def blast_cell(inc: Incident, state: ViewState) -> html.Span:
    """The jobs (linked), their users and the GPUs the incident hurts."""
    parts: list[Any] = []
    for job in inc.jobs:
        parts += [" · " if parts else "", "job ", link(job, job_path(job), state)]
    if inc.users:
        parts.append(f" ({', '.join(inc.users)})")
    if inc.gpus:
        parts.append(f"{' · ' if parts else ''}{len(inc.gpus)} GPU{'s' if len(inc.gpus) > 1 else ''}")
    return html.Span(parts or [MISSING])


def action_cell(inc: Incident) -> html.Details:
    """The action; its runbook opens under it."""
    return html.Details(
        [html.Summary(flag(inc.action, "action")), html.Div(inc.runbook or MISSING, className="gl-hint")]
    )


def timeline_cell(inc: Incident) -> html.Details:
    """The member alerts in the order they fired: when, the rule, what explains it, resolved when."""
    items = []
    for m in inc.members:
        when = minute_text(m.fired_at) + (f" → {minute_text(m.resolved_at)}" if m.resolved_at is not None else "")
        cause = " (explained)" if m.explained_by else " (cause)"
        items.append(html.Li([html.Span(when, className="mono"), " ", html.Strong(m.rule), cause, " ", m.summary]))
    names = ", ".join(dict.fromkeys(m.rule for m in inc.members))
    return html.Details(
        [
            html.Summary(f"{len(inc.members)} alert{'s' if len(inc.members) > 1 else ''}: {names}"),
            html.Ol(items, className="gl-timeline"),
        ]
    )


def age_cell(inc: Incident, now: float) -> str:
    """When its fault began and for how long (to its end, or to now)."""
    end = inc.resolved_at if inc.resolved_at is not None else now
    text = f"{minute_text(inc.started_at)} ({duration_text(end - inc.started_at)})"
    return text if inc.resolved_at is None else f"{text}, resolved {minute_text(inc.resolved_at)}"


def incidents_table(incidents: Sequence[Incident], state: ViewState, now: float, *, empty: str) -> html.Div:
    rows: list[list[Cell]] = [
        [
            flag(inc.severity or MISSING, inc.severity),
            culprit_cell(inc, state),
            blast_cell(inc, state),
            action_cell(inc),
            age_cell(inc, now),
            timeline_cell(inc),
        ]
        for inc in incidents
    ]
    columns = ["severity", "culprit", "blast radius", "action", "began", "alerts"]
    return table(columns, rows, empty=empty, limit=MAX_ROWS)


def touches(inc: Incident, subject: Mapping[str, str]) -> bool:
    """Whether the incident touches a node, a GPU (by UUID) or a job."""
    if node := subject.get("node"):
        return inc.culprit.node == node or any(m.labels.get("node") == node for m in inc.members)
    if uuid := subject.get("uuid"):
        return inc.culprit.uuid == uuid or any(m.labels.get("uuid") == uuid for m in inc.members)
    if job := subject.get("job_id"):
        return job in inc.jobs
    return True  # the overview: every open incident


def incident_panel(panel_id: str, subject: Mapping[str, str], title: str = "Incidents") -> html.Div:
    """The panel of the open incidents touching ``subject`` (empty: all), filled by ``register_incident_panel``."""
    return panel(title, html.Div(id=panel_id), dcc.Store(id=f"{panel_id}-subject", data=dict(subject)))


def register_incident_panel(app: Dash, context: Context, panel_id: str, toolbar: Toolbar) -> None:
    @app.callback(
        Output(panel_id, "children"),
        Input(toolbar.range, "value"),
        Input(toolbar.interval, "n_intervals"),
        State(f"{panel_id}-subject", "data"),
    )
    def update(range_: str, _tick: int | None, subject: Mapping[str, str] | None) -> Any:
        return touching(context, view_state(range_, "", "", None), subject or {})


def touching(context: Context, state: ViewState, subject: Mapping[str, str]) -> Any:
    reader = incident_reader(context)
    if reader is None:
        return html.Div("no incident store connected", className="gl-empty")

    def load() -> Sequence[Incident] | None:
        try:
            return reader.open_incidents()
        except NotAvailableOnBackend:
            return None

    try:
        loaded = guarded(context, load)
    except PageError as problem:
        return problem.banner
    if loaded is None:
        return html.Div("no incident store connected", className="gl-empty")
    found = [i for i in loaded if touches(i, subject)]
    return incidents_table(found, state, context.clock.now(), empty="no open incident")
