"""GPU (``/gpus/<uuid>``): one GPU's metrics over time against its limits, what it is, and what runs on it."""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import unquote

from dash import Dash, html

from gpulens.dashboard import ids
from gpulens.dashboard.components import (
    ViewState,
    banner,
    link,
    page_header,
    panel,
    processes_table,
    register_page,
    register_toolbar,
)
from gpulens.dashboard.context import Context
from gpulens.dashboard.figures.links import pcie_degraded
from gpulens.dashboard.figures.style import palette_color
from gpulens.dashboard.formatting import MISSING, bytes_text, celsius_text, gpu_label, percent_text, watts_text
from gpulens.dashboard.gpuview import chart_panels, load_gpu_view, register_gpu_view
from gpulens.dashboard.incidentview import incident_panel, register_incident_panel
from gpulens.dashboard.pages.alerts import related_alerts
from gpulens.dashboard.panels import gpu_series
from gpulens.dashboard.paths import job_path, node_path
from gpulens.dashboard.timerange import minute_text
from gpulens.model import GpuJob, GpuReading, throttle_reason_names
from gpulens.xidcatalogue import xid_action, xid_name

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
            incident_panel(ids.GPU_INCIDENTS, {"uuid": name}, "Incidents on this GPU"),
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
    register_incident_panel(app, context, ids.GPU_INCIDENTS, IDS)
    outputs = (ids.GPU_TITLE, ids.GPU_INFO, ids.GPU_CHARTS, ids.GPU_PROCESSES, ids.GPU_ALERTS)
    register_gpu_view(app, context, IDS, outputs, ids.GPU_UUID, render, ("GPU", None, [], None, None))


def render(context: Context, state: ViewState, uuid: str) -> tuple[Any, ...]:
    view = load_gpu_view(context, state, lambda r: r.uuid == uuid, MAX_POINTS, uuids=[uuid])
    reading = next(iter(view.readings), None)
    if reading is None:
        missing = banner("info", "This GPU is not in the database.", " Check the UUID.")
        return missing, "GPU", None, [], None, None, view.updated
    held = [j for j in view.jobs if j.uuid == uuid]
    status = None
    if not reading.up:
        status = banner("bad", "This GPU reads as down.", " Lost or unreadable (see XID 79 and the node's log).")
    elif view.now - reading.timestamp > context.stale_after_s:
        status = banner(
            "warn", "No recent reading from this GPU.", f" The newest is from {minute_text(reading.timestamp)}."
        )
    gpus = [gpu_series(view.series.get(uuid), f"GPU {reading.gpu}", palette_color(0))]
    job_ids = {j.job_id for j in held}
    charts = chart_panels(view, gpus, ids.GPU_CHART, periods=view.periods(job_ids))
    heading = f"GPU {gpu_label(reading.node, reading.gpu)}"
    own = None if view.processes is None else [p for p in view.processes if p.uuid == uuid]
    alerts = related_alerts(view.related(lambda a: a.labels.get("uuid") == uuid, job_ids), state, view.now)
    return status, heading, info_list(reading, held, state), charts, processes_table(own, state), alerts, view.updated


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
        ("utilization", percent_text(r.utilization_ratio)),
        ("memory", f"{bytes_text(r.memory_used_bytes)} of {bytes_text(r.memory_total_bytes)}"),
        (
            "temperature",
            f"{celsius_text(r.temperature_celsius)} (slowdown at {celsius_text(r.slowdown_temperature_celsius)})",
        ),
        ("power", f"{watts_text(r.power_watts)} of {watts_text(r.power_limit_watts)}"),
        (
            "PCIe link",
            f"Gen{r.pcie_link_generation or '?'} x{r.pcie_link_width or '?'} of "
            f"Gen{r.pcie_link_generation_max or '?'} x{r.pcie_link_width_max or '?'}"
            + (" (degraded)" if pcie_degraded(r) else ""),
        ),
        ("NVLink", "none" if not r.nvlink_links_active else f"{r.nvlink_links_active} links active"),
        ("throttle", ", ".join(throttle_reason_names(r.throttle_reasons or 0)) or "none"),
        ("XIDs", "; ".join(_xid_text(code, n) for code, n in sorted(r.xid_errors.items())) or "none"),
    ]
    children: list[Any] = []
    for key, value in pairs:
        children += [html.Dt(key), html.Dd(value)]
    return html.Dl(children, className="gl-kv wide")


def _xid_text(code: int, count: int) -> str:
    """``79 GPU has fallen off the bus x1 (action: reboot)``: the XID catalogue's name and action."""
    return f"{code} {xid_name(code)} x{count} (action: {xid_action(code, count)})"
