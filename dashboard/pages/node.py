"""Node (``/nodes/<node>``): every metric of the node's GPUs over time against its limits, and its processes."""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import unquote

from dash import Dash, html

from gpulens.dashboard import ids
from gpulens.dashboard.components import (
    Cell,
    ViewState,
    banner,
    color_key,
    link,
    page_header,
    panel,
    processes_table,
    register_page,
    register_toolbar,
    table,
)
from gpulens.dashboard.context import Context
from gpulens.dashboard.figures.style import palette_color
from gpulens.dashboard.formatting import MISSING, celsius_text, percent_text, watts_text
from gpulens.dashboard.gpuview import chart_panels, load_gpu_view, register_gpu_view
from gpulens.dashboard.incidentview import incident_panel, register_incident_panel
from gpulens.dashboard.pages.alerts import related_alerts
from gpulens.dashboard.panels import gpu_series
from gpulens.dashboard.paths import gpu_path, job_path
from gpulens.dashboard.timerange import minute_text
from gpulens.ratios import memory_used_ratio_of

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
            incident_panel(ids.NODE_INCIDENTS, {"node": name}, "Incidents on this node"),
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
    register_incident_panel(app, context, ids.NODE_INCIDENTS, IDS)
    outputs = (ids.NODE_INFO, ids.NODE_GPUS, ids.NODE_CHARTS, ids.NODE_PROCESSES, ids.NODE_ALERTS)
    register_gpu_view(app, context, IDS, outputs, ids.NODE_NAME, render, ("", None, [], None, None))


def render(context: Context, state: ViewState, node: str) -> tuple[Any, ...]:
    view = load_gpu_view(context, state, lambda r: r.node == node, MAX_POINTS, node=node)
    readings = sorted(view.readings, key=lambda r: r.gpu)
    if not readings:
        missing = banner(
            "info", f"No GPU of node {node!r} is in the database.", " Check the name, or wait for the collector."
        )
        return missing, "", None, [], None, None, view.updated
    node_jobs = [j for j in view.jobs if j.node == node]
    stale = [r for r in readings if view.now - r.timestamp > context.stale_after_s]
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
    gpus = [gpu_series(view.series.get(r.uuid), f"GPU {r.gpu}", palette_color(r.gpu)) for r in readings]
    job_ids = {j.job_id for j in node_jobs}
    charts = chart_panels(view, gpus, ids.NODE_CHART, legend=False, periods=view.periods(job_ids))
    key = color_key([(g.label, g.color) for g in gpus], ["red dashed: the limit", "times in UTC"])
    rows: list[list[Cell]] = []
    for r in readings:
        held = [j for j in node_jobs if j.uuid == r.uuid]
        rows.append(
            [
                link(f"GPU {r.gpu}", gpu_path(r.uuid), state),
                html.Span(r.uuid, className="mono"),
                html.Span("up" if r.up else "down", className=f"gl-flag {'up' if r.up else 'down'}"),
                percent_text(r.utilization_ratio),
                percent_text(memory_used_ratio_of(r)),
                celsius_text(r.temperature_celsius),
                watts_text(r.power_watts),
                html.Span([link(j.job_id, job_path(j.job_id), state) for j in held]) if held else MISSING,
                ", ".join(sorted({j.user for j in held if j.user})) or MISSING,
            ]
        )
    gpu_table = table(
        ["GPU", "UUID", "state", "util", "memory", "temp", "power", "job", "user"],
        rows,
        numeric=["util", "memory", "temp", "power"],
    )
    node_processes = None if view.processes is None else [p for p in view.processes if p.node == node]
    charts_grid = [key, html.Div(charts, className="gl-charts")]
    alerts = related_alerts(view.related(lambda a: a.labels.get("node") == node, job_ids), state, view.now)
    return status, info, gpu_table, charts_grid, processes_table(node_processes, state), alerts, view.updated
