"""Node (``/nodes/<node>``): every metric of the node's GPUs over time against its limits, and its processes."""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import unquote

from dash import Dash, Output, State, html

from dashboard import figures, ids
from dashboard.components import (
    Cell,
    ViewState,
    banner,
    color_key,
    graph_panel,
    link,
    page_header,
    panel,
    processes_table,
    register_page,
    register_toolbar,
    table,
    toolbar_inputs,
    view_state,
)
from dashboard.context import Context, PageError, guarded
from dashboard.figures import MISSING
from dashboard.pages.alerts import about_alerts
from dashboard.panels import FIELDS, gpu_charts, gpu_series
from dashboard.paths import gpu_path, job_path
from dashboard.timerange import minute_text, resolve_range
from storage import latest, timeseries

PATH_TEMPLATE: Final = "/nodes/<node>"
IDS: Final = ids.NODE
MAX_POINTS: Final = 120  # per series: 8 GPUs x ~30 lines in ~400 kB; the GPU page has the detail


def title(node: str = "") -> str:
    return f"{unquote(node)} · gpulens" if node else "Node · gpulens"


def layout(node: str = "", **query: Any) -> html.Div:
    name = unquote(node)
    state = ViewState.from_query(query)
    return html.Div(
        [
            page_header(f"Node {name}", html.Span(id=ids.NODE_INFO), IDS, state),
            html.Div(id=IDS.status),
            panel("GPUs", html.Div(id=ids.NODE_GPUS)),
            html.Div(id=ids.NODE_CHARTS),
            panel("Processes", html.Div(id=ids.NODE_PROCESSES)),
            panel("Alerts", html.Div(id=ids.NODE_ALERTS)),
            html.Div(name, id=ids.NODE_NAME, hidden=True),
        ]
    )


def register(app: Dash, context: Context) -> None:
    register_page(__name__, path_template=PATH_TEMPLATE, title=title, name="Node", layout=layout)
    register_toolbar(app, IDS)

    @app.callback(
        Output(IDS.status, "children"),
        Output(ids.NODE_INFO, "children"),
        Output(ids.NODE_GPUS, "children"),
        Output(ids.NODE_CHARTS, "children"),
        Output(ids.NODE_PROCESSES, "children"),
        Output(ids.NODE_ALERTS, "children"),
        Output(IDS.updated, "children"),
        *toolbar_inputs(IDS),
        State(ids.NODE_NAME, "children"),
        State(IDS.refresh, "value"),
    )
    def update(range_: str, start: str, end: str, _tick: int | None, node: str, refresh: str) -> tuple[Any, ...]:
        state = view_state(range_, start, end, refresh)
        try:
            return render(context, state, node)
        except PageError as problem:
            return problem.banner, "", None, [], None, None, problem.as_of


def render(context: Context, state: ViewState, node: str) -> tuple[Any, ...]:
    now = context.clock.now()

    def load() -> tuple[Any, ...]:
        span = resolve_range(state.range, state.start, state.end, now)
        readings = [r for r in latest.latest_readings(context.db) if r.node == node]
        jobs, processes = latest.latest_snapshot_parts(context.db)
        series = timeseries.series(context.db, [r.uuid for r in readings], FIELDS, span.start, span.end, MAX_POINTS)
        active = context.alerts.active() if context.alerts is not None else None
        return span, readings, jobs, processes, series, active

    span, readings, jobs, processes, series, active = guarded(context, load)
    updated = f"as of {minute_text(now)} · {span.label}"
    if not readings:
        return (
            banner(
                "info", f"No GPU of node {node!r} is in the database.", " Check the name, or wait for the collector."
            ),
            "",
            None,
            [],
            None,
            None,
            updated,
        )
    readings.sort(key=lambda r: r.gpu)
    node_jobs = [j for j in jobs if j.node == node]
    stale = [r for r in readings if now - r.timestamp > context.stale_after_s]
    status = (
        banner(
            "warn",
            "No recent reading from this node.",
            f" The newest is from {minute_text(max(r.timestamp for r in readings))}.",
        )
        if len(stale) == len(readings)
        else None
    )
    models = sorted({r.model for r in readings})
    driver = next((r.driver_version for r in readings if r.driver_version), None)
    info = f"{len(readings)} x {', '.join(models)}" + (f" · driver {driver}" if driver else "")
    gpus = [gpu_series(series.get(r.uuid), f"GPU {r.gpu}", figures.palette_color(r.gpu)) for r in readings]
    charts = [
        graph_panel(ids.NODE_CHART.format(c.key), c.title, c.figure)
        for c in gpu_charts(gpus, start=span.start, end=span.end, legend=False)
    ]
    key = color_key([(g.label, g.color) for g in gpus], ["red dashed: the limit", "times in UTC"])
    rows: list[list[Cell]] = []
    for r in readings:
        held = [j for j in node_jobs if j.uuid == r.uuid]
        rows.append(
            [
                link(f"GPU {r.gpu}", gpu_path(r.uuid), state),
                html.Span(r.uuid, className="mono"),
                html.Span("up" if r.up else "down", className=f"gl-flag {'up' if r.up else 'down'}"),
                figures.percent_text(r.utilization_ratio),
                figures.percent_text(figures.memory_ratio(r)),
                figures.celsius_text(r.temperature_celsius),
                figures.watts_text(r.power_watts),
                html.Span([link(j.job_id, job_path(j.job_id), state) for j in held]) if held else MISSING,
                ", ".join(sorted({j.user for j in held if j.user})) or MISSING,
            ]
        )
    gpu_table = table(
        ["GPU", "UUID", "state", "util", "memory", "temp", "power", "job", "user"],
        rows,
        numeric=["util", "memory", "temp", "power"],
    )
    node_processes = [p for p in processes if p.node == node]
    charts_grid = [key, html.Div(charts, className="gl-charts")]
    alerts = about_alerts(active, lambda a: a.labels.get("node") == node, state, now)
    return status, info, gpu_table, charts_grid, processes_table(node_processes, state), alerts, updated
