"""Layout pieces every page shares: the toolbar, banners, cards, tables, links and the URL state they carry."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlencode

import dash
from dash import ClientsideFunction, Dash, Input, Output, State, dcc, html
from dash.development.base_component import Component

from gpulens.dashboard.formatting import MISSING, bytes_text
from gpulens.dashboard.ids import Toolbar
from gpulens.dashboard.paths import gpu_path, job_path
from gpulens.dashboard.timerange import CUSTOM, DEFAULT_RANGE, DEFAULT_REFRESH, PRESETS, RANGE_OPTIONS, REFRESH
from gpulens.model import ProcessReading
from gpulens.storage.reading import NOT_AVAILABLE

Child = Component | str
Cell = Component | str | None  # a table cell

# Plotly's toolbar without its logo and the selection tools no chart here uses.
GRAPH_CONFIG: Final[dcc.Graph.Config] = {"displaylogo": False, "modeBarButtonsToRemove": ["lasso2d", "select2d"]}


@dataclass(frozen=True, slots=True)
class ViewState:
    """The state every page's URL carries: the time range and the auto-refresh period (query values as typed)."""

    range: str = DEFAULT_RANGE
    start: str = ""
    end: str = ""
    refresh: str = DEFAULT_REFRESH

    @classmethod
    def from_query(cls, query: Mapping[str, Any]) -> ViewState:
        """Read ``?range=6h&from=...&to=...&refresh=1m``; unknown values fall back to the defaults."""
        range_ = str(query.get("range") or "")
        refresh = str(query.get("refresh") or "")
        return cls(
            range=range_ if range_ in RANGE_OPTIONS else DEFAULT_RANGE,
            start=str(query.get("from") or "")[:40],
            end=str(query.get("to") or "")[:40],
            refresh=refresh if refresh in REFRESH else DEFAULT_REFRESH,
        )

    def query(self) -> dict[str, str]:
        params = {"range": self.range}
        if self.range == CUSTOM:
            params.update({"from": self.start, "to": self.end})
        if self.refresh != DEFAULT_REFRESH:
            params["refresh"] = self.refresh
        return {k: v for k, v in params.items() if v}


def href(path: str, state: ViewState | None = None, **params: str | int) -> str:
    """A link inside the dashboard that keeps the time range (and adds ``params``)."""
    query = dict(state.query()) if state is not None else {}
    query.update({k: str(v) for k, v in params.items() if v != ""})
    return f"{path}?{urlencode(query)}" if query else path


def link(text: str, path: str, state: ViewState | None = None) -> dcc.Link:
    return dcc.Link(text, href=href(path, state))


# --- toolbar --------------------------------------------------------------------------------------------------------


def toolbar(ids: Toolbar, state: ViewState) -> html.Div:
    """Time range (presets and custom), auto-refresh, and the plumbing that keeps the URL in step."""
    custom_class = "gl-custom" if state.range == CUSTOM else "gl-custom hidden"
    return html.Div(
        className="gl-toolbar",
        children=[
            dcc.RadioItems(
                id=ids.range,
                className="gl-seg",
                options=[{"label": name, "value": name} for name in (*PRESETS, CUSTOM)],
                value=state.range,
                inline=True,
            ),
            html.Span(
                id=ids.custom,
                className=custom_class,
                children=[
                    dcc.Input(
                        id=ids.start,
                        type="text",
                        value=state.start,
                        className="gl-input gl-time",
                        debounce=True,
                        placeholder="2026-01-01T00:00",
                    ),
                    html.Span("to", className="gl-hint"),
                    dcc.Input(
                        id=ids.end,
                        type="text",
                        value=state.end,
                        className="gl-input gl-time",
                        debounce=True,
                        placeholder="now",
                    ),
                    html.Span("UTC", className="gl-hint"),
                ],
            ),
            html.Label("refresh", htmlFor=ids.refresh),
            dcc.Dropdown(
                id=ids.refresh,
                className="gl-dropdown",
                options=[{"label": name, "value": name} for name in REFRESH],
                value=state.refresh,
                clearable=False,
                searchable=False,
                style={"width": "86px"},
            ),
            dcc.Interval(id=ids.interval, interval=30_000, disabled=True),
            dcc.Store(id=ids.url_sync),
            dcc.Location(id=ids.nav, refresh="callback-nav"),
        ],
    )


def page_header(title: Child, subtitle: Child | None, ids: Toolbar, state: ViewState) -> html.Div:
    return html.Div(
        className="gl-header",
        children=[
            html.Div([html.H1(title), html.Div(subtitle, className="gl-sub") if subtitle is not None else None]),
            html.Div([toolbar(ids, state), html.Div(id=ids.updated, className="gl-updated")]),
        ],
    )


def clientside(app: Dash, function: ClientsideFunction | str, *dependencies: Output | Input | State, **kw: Any) -> None:
    """``app.clientside_callback``, typed (Dash leaves it unannotated)."""
    app.clientside_callback(function, *dependencies, **kw)  # type: ignore[no-untyped-call]


def register_page(module: str, **kw: Any) -> None:
    """``dash.register_page``, typed (Dash leaves it unannotated)."""
    dash.register_page(module, **kw)  # type: ignore[no-untyped-call]


def register_toolbar(app: Dash, ids: Toolbar, state: Sequence[tuple[str, str, str]] = ()) -> None:
    """Clientside callbacks of a page's toolbar: refresh period, custom-range inputs, and the URL.

    ``state`` adds the page's own URL state: (component id, property, query-parameter name).
    """
    clientside(
        app,
        ClientsideFunction("gpulens", "refreshInterval"),
        Output(ids.interval, "interval"),
        Output(ids.interval, "disabled"),
        Input(ids.refresh, "value"),
    )
    clientside(
        app,
        ClientsideFunction("gpulens", "customVisibility"),
        Output(ids.custom, "className"),
        Input(ids.range, "value"),
    )
    synced = [(ids.range, "value", "range"), (ids.start, "value", "from"), (ids.end, "value", "to")]
    synced += [(ids.refresh, "value", "refresh"), *state]
    keys = [key for _, _, key in synced]
    clientside(
        app,
        f"function() {{ return window.dash_clientside.gpulens.syncUrl(...arguments, {keys!r}); }}",
        Output(ids.url_sync, "data"),
        *(Input(component, prop) for component, prop, _ in synced),
    )


def register_click_through(app: Dash, ids: Toolbar, graph_id: str) -> None:
    """A click on a point of ``graph_id`` that carries a dashboard path navigates there (see gpulens.js)."""
    clientside(
        app,
        ClientsideFunction("gpulens", "clickThrough"),
        Output(ids.nav, "href", allow_duplicate=True),
        Input(graph_id, "clickData"),
        prevent_initial_call=True,
    )


def toolbar_inputs(ids: Toolbar) -> list[Input]:
    """The inputs that re-run a page's data callback: the range, custom times, and the refresh tick."""
    return [
        Input(ids.range, "value"),
        Input(ids.start, "value"),
        Input(ids.end, "value"),
        Input(ids.interval, "n_intervals"),
    ]


def view_state(range_: str | None, start: str | None, end: str | None, refresh: str | None) -> ViewState:
    return ViewState.from_query({"range": range_, "from": start, "to": end, "refresh": refresh})


# --- banners, cards, tables -----------------------------------------------------------------------------------------


def banner(tone: str, title: str, detail: Child | None = None, items: Sequence[Child] = ()) -> html.Div:
    """A message across the page: ``tone`` is ``bad`` (broken), ``warn`` (degraded) or ``info`` (empty)."""
    children: list[Child] = [html.Strong(title)]
    if detail is not None:
        children.append(detail)
    if items:
        children.append(html.Ul([html.Li(item) for item in items]))
    return html.Div(className=f"gl-banner {tone}", role="status", children=children)


def card(label: str, value: str, detail: str | None = None, tone: str | None = None) -> html.Div:
    return html.Div(
        className=f"gl-card {tone or ''}".strip(),
        children=[
            html.Div(label, className="gl-card-label"),
            html.Div(value, className="gl-card-value"),
            html.Div(detail or "\u00a0", className="gl-card-detail"),
        ],
    )


def flag(text: str, kind: str | None = None) -> html.Span:
    return html.Span(text, className=f"gl-flag {kind or text}")


def table(
    columns: Sequence[str],
    rows: Sequence[Sequence[Cell]],
    *,
    numeric: Sequence[str] = (),
    row_classes: Sequence[str] | None = None,
    empty: str = "nothing to show",
    table_id: str | None = None,
    limit: int = 200,
) -> html.Div:
    """A plain HTML table (dcc.Link cells navigate inside the app); ``numeric`` columns are right-aligned.

    At most ``limit`` rows are sent (thousands of rows cost the browser seconds); the table says how many it left out.
    """
    if not rows:
        return html.Div(empty, className="gl-empty")
    left_out = len(rows) - limit
    rows = rows[:limit]
    num = set(numeric)
    # a class only where one is set: ``className: null`` on every cell was a sixth of a 200-row table's bytes
    right: dict[str, Any] = {"className": "num"}
    plain: dict[str, Any] = {}
    head = html.Thead(html.Tr([html.Th(c, **(right if c in num else plain)) for c in columns]))
    body = html.Tbody(
        [
            html.Tr(
                [html.Td(cell, **(right if col in num else plain)) for col, cell in zip(columns, row, strict=True)],
                **(_row_class(row_classes[i]) if row_classes else plain),
            )
            for i, row in enumerate(rows)
        ]
    )
    table_kwargs: dict[str, Any] = {"className": "gl-table"}
    if table_id:
        table_kwargs["id"] = table_id
    note = (
        html.Div(f"showing the first {limit} of {limit + left_out} rows", className="gl-hint") if left_out > 0 else None
    )
    return html.Div(className="gl-table-wrap", children=[html.Table([head, body], **table_kwargs), note])


def _row_class(name: str) -> dict[str, Any]:
    return {"className": name} if name else {}


def panel(title: Child | None, *children: Child | None, controls: Child | None = None, **kwargs: Any) -> html.Div:
    head: list[Child] = []
    if title is not None or controls is not None:
        head = [html.Div(className="gl-panel-head", children=[html.H2(title), controls])]
    return html.Div(className="gl-panel", children=[*head, *children], **kwargs)


def graph(graph_id: str) -> dcc.Graph:
    """A chart that a callback fills."""
    return dcc.Graph(id=graph_id, config=GRAPH_CONFIG)


def graph_panel(graph_id: str, title: str, figure: Any) -> html.Div:
    """A titled chart, its figure already built (pages that render their charts in one callback)."""
    return panel(title, dcc.Graph(id=graph_id, figure=figure, config=GRAPH_CONFIG))


def processes_table(processes: Sequence[ProcessReading] | None, state: ViewState) -> html.Div:
    """GPU processes with their jobs and users (the command is the base name only, never the full command line).

    ``None``: the store keeps no process table (said so, not shown as "no GPU processes")."""
    if processes is None:
        return html.Div(f"GPU processes: {NOT_AVAILABLE}", className="gl-empty")
    rows = [
        [
            link(f"{p.node}:{p.gpu}", gpu_path(p.uuid), state),
            str(p.pid) if p.pid else MISSING,  # 0: a job's processes together (Prometheus, no pids exported)
            p.user or MISSING,
            link(p.job_id, job_path(p.job_id), state) if p.job_id else MISSING,
            p.command or MISSING,
            bytes_text(p.memory_used_bytes),
        ]
        for p in sorted(processes, key=lambda p: (p.node, p.gpu, p.pid))
    ]
    return table(
        ["GPU", "PID", "user", "job", "command", "memory"], rows, numeric=["PID", "memory"], empty="no GPU processes"
    )


def color_key(entries: Sequence[tuple[str, str]], notes: Sequence[str] = ()) -> html.Div:
    """One legend for a page of charts: a swatch per (label, colour), then notes on line styles."""
    return html.Div(
        className="gl-key",
        children=[
            *(html.Span([html.I(style={"background": color}), label]) for label, color in entries),
            *(html.Span(note, className="gl-hint") for note in notes),
        ],
    )
