"""GPU (``/gpus/<uuid>``): one GPU's metrics over time against its limits, what it is, and what runs on it."""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import unquote

from dash import Dash, Output, State, html

from dashboard import figures, ids
from dashboard.components import (
    ViewState,
    banner,
    graph_panel,
    link,
    page_header,
    panel,
    processes_table,
    register_page,
    register_toolbar,
    toolbar_inputs,
    view_state,
)
from dashboard.context import Context, PageError, guarded
from dashboard.figures import MISSING
from dashboard.pages.alerts import about_alerts
from dashboard.panels import FIELDS, gpu_charts, gpu_series
from dashboard.paths import job_path, node_path
from dashboard.timerange import minute_text, resolve_range
from gpulens.model import GpuJob, GpuReading, throttle_reason_names
from storage import latest, timeseries

PATH_TEMPLATE: Final = "/gpus/<uuid>"
IDS: Final = ids.GPU
MAX_POINTS: Final = 600


def title(uuid: str = "") -> str:
    return f"GPU {unquote(uuid)[:16]} · gpulens" if uuid else "GPU · gpulens"


def layout(uuid: str = "", **query: Any) -> html.Div:
    name = unquote(uuid)
    state = ViewState.from_query(query)
    return html.Div(
        [
            page_header(html.Span(id=ids.GPU_TITLE, children="GPU"), html.Span(name, className="mono"), IDS, state),
            html.Div(id=IDS.status),
            panel("This GPU", html.Div(id=ids.GPU_INFO)),
            html.Div(id=ids.GPU_CHARTS, className="gl-charts"),
            panel("Processes", html.Div(id=ids.GPU_PROCESSES)),
            panel("Alerts", html.Div(id=ids.GPU_ALERTS)),
            html.Div(name, id=ids.GPU_UUID, hidden=True),
        ]
    )


def register(app: Dash, context: Context) -> None:
    register_page(__name__, path_template=PATH_TEMPLATE, title=title, name="GPU", layout=layout)
    register_toolbar(app, IDS)

    @app.callback(
        Output(IDS.status, "children"),
        Output(ids.GPU_TITLE, "children"),
        Output(ids.GPU_INFO, "children"),
        Output(ids.GPU_CHARTS, "children"),
        Output(ids.GPU_PROCESSES, "children"),
        Output(ids.GPU_ALERTS, "children"),
        Output(IDS.updated, "children"),
        *toolbar_inputs(IDS),
        State(ids.GPU_UUID, "children"),
        State(IDS.refresh, "value"),
    )
    def update(range_: str, start: str, end: str, _tick: int | None, uuid: str, refresh: str) -> tuple[Any, ...]:
        state = view_state(range_, start, end, refresh)
        try:
            return render(context, state, uuid)
        except PageError as problem:
            return problem.banner, "GPU", None, [], None, None, problem.as_of


def render(context: Context, state: ViewState, uuid: str) -> tuple[Any, ...]:
    now = context.clock.now()

    def load() -> tuple[Any, ...]:
        span = resolve_range(state.range, state.start, state.end, now)
        reading = next((r for r in latest.latest_readings(context.db) if r.uuid == uuid), None)
        jobs, processes = latest.latest_snapshot_parts(context.db)
        series = timeseries.series(context.db, [uuid], FIELDS, span.start, span.end, MAX_POINTS) if reading else {}
        active = context.alerts.active() if context.alerts is not None else None
        return span, reading, jobs, processes, series, active

    span, reading, jobs, processes, series, active = guarded(context, load)
    updated = f"as of {minute_text(now)} · {span.label}"
    if reading is None:
        missing = banner("info", "This GPU is not in the database.", " Check the UUID.")
        return missing, "GPU", None, [], None, None, updated
    held = [j for j in jobs if j.uuid == uuid]
    status = None
    if not reading.up:
        status = banner("bad", "This GPU reads as down.", " Lost or unreadable (see XID 79 and the node's log).")
    elif now - reading.timestamp > context.stale_after_s:
        status = banner(
            "warn", "No recent reading from this GPU.", f" The newest is from {minute_text(reading.timestamp)}."
        )
    gpus = [gpu_series(series.get(uuid), f"GPU {reading.gpu}", figures.palette_color(0))]
    charts = [
        graph_panel(ids.GPU_CHART.format(c.key), c.title, c.figure)
        for c in gpu_charts(gpus, start=span.start, end=span.end)
    ]
    heading = f"GPU {figures.gpu_label(reading.node, reading.gpu)}"
    own = [p for p in processes if p.uuid == uuid]
    alerts = about_alerts(active, lambda a: a.labels.get("uuid") == uuid, state, now)
    return status, heading, info_list(reading, held, state), charts, processes_table(own, state), alerts, updated


def info_list(r: GpuReading, jobs: list[GpuJob], state: ViewState) -> html.Dl:
    """What the GPU is and how it is now: identity, link state, the newest reading."""
    pairs: list[tuple[str, Any]] = [
        ("node", link(r.node, node_path(r.node), state)),
        ("model", r.model),
        ("UUID", html.Span(r.uuid, className="mono")),
        ("PCI bus", r.pci_bus_id or MISSING),
        ("driver", r.driver_version or MISSING),
        ("jobs", html.Span([link(j.job_id, job_path(j.job_id), state) for j in jobs]) if jobs else "none"),
        ("users", ", ".join(sorted({j.user for j in jobs if j.user})) or MISSING),
        ("newest reading", minute_text(r.timestamp)),
        ("utilization", figures.percent_text(r.utilization_ratio)),
        ("memory", f"{figures.bytes_text(r.memory_used_bytes)} of {figures.bytes_text(r.memory_total_bytes)}"),
        (
            "temperature",
            f"{figures.celsius_text(r.temperature_celsius)} (slowdown at "
            f"{figures.celsius_text(r.slowdown_temperature_celsius)})",
        ),
        ("power", f"{figures.watts_text(r.power_watts)} of {figures.watts_text(r.power_limit_watts)}"),
        (
            "PCIe link",
            f"Gen{r.pcie_link_generation or '?'} x{r.pcie_link_width or '?'} of "
            f"Gen{r.pcie_link_generation_max or '?'} x{r.pcie_link_width_max or '?'}"
            + (" (degraded)" if figures.pcie_degraded(r) else ""),
        ),
        ("NVLink", "none" if not r.nvlink_links_active else f"{r.nvlink_links_active} links active"),
        ("throttle", ", ".join(throttle_reason_names(r.throttle_reasons or 0)) or "none"),
        ("XIDs", ", ".join(f"{code} x{n}" for code, n in sorted(r.xid_errors.items())) or "none"),
    ]
    children: list[Any] = []
    for key, value in pairs:
        children += [html.Dt(key), html.Dd(value)]
    return html.Dl(children, className="gl-kv wide")
