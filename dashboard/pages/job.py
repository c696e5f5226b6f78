"""Job (``/jobs/<job_id>``): the job's GPUs over time (utilization, NVLink traffic, power: one row per GPU, so a
512-GPU job reads as well as a 2-GPU one), with the periods its stall, straggler and idle alerts fired marked; under
them its fabric traffic (the RDMA ports next to its GPUs, per node) and its host CPU (its cgroup, per node).
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import unquote

from dash import Dash, Output, State, html

from gpulens.config import format_duration
from gpulens.dashboard import ids
from gpulens.dashboard.components import (
    Cell,
    ViewState,
    banner,
    flag,
    graph_panel,
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
from gpulens.dashboard.figures.gputime import Row, gpu_time_heatmap
from gpulens.dashboard.flags import FLAG_ORDER, JOB_FLAGS, alert_jobs, job_flags, job_periods
from gpulens.dashboard.formatting import gpu_label, percent_text
from gpulens.dashboard.grid import natural_key
from gpulens.dashboard.heatmaps import METRICS, Metric
from gpulens.dashboard.incidentview import incident_panel, register_incident_panel
from gpulens.dashboard.inspectorview import bandwidth_panel, link_ceiling, read_bandwidth
from gpulens.dashboard.jobhost import job_host_panels, read_job_host
from gpulens.dashboard.ncclview import accused_ranks, nccl_panel, read_nccl
from gpulens.dashboard.pages.alerts import alerts_table, fired_newest_first
from gpulens.dashboard.paths import gpu_path, node_path
from gpulens.dashboard.timerange import CUSTOM, minute_text, resolve_range
from gpulens.dashboard.unavailable import Missing, attempt, missing_of, not_available
from gpulens.hardware import nvlink_max_bytes_per_second
from gpulens.model import JobInfo
from gpulens.ratios import busiest_direction, nvlink_utilization_ratio, power_limit_ratio, share
from gpulens.storage.records import JobAccount, SeriesData

log = logging.getLogger(__name__)
PATH_TEMPLATE: Final = "/jobs/<job_id>"
IDS: Final = ids.JOB
FIELDS: Final = (
    "utilization_ratio",
    "nvlink_tx_bytes_per_second",
    "nvlink_rx_bytes_per_second",
    "nvlink_links_active",
    "power_watts",
    "power_limit_watts",
)
LIFETIME_LOOKBACK_S: Final = 7 * 86400.0  # how far back the page looks for the job's lifetime
RUNNING_WITHIN_S: Final = 180.0  # a job seen this recently is still running: its range ends at now
POINT_BUDGET: Final = 60_000  # series points per page, shared by the job's GPUs
BINS: Final = 160

_NVLINK: Final = Metric(
    "nvlink", "NVLink (of link max)", nvlink_utilization_ratio, percent_text, 0, 1, "Viridis", ((0.0, "0%"),)
)
_POWER: Final = METRICS["power"]
_UTIL: Final = METRICS["utilization"]


def title(job_id: str = "") -> str:
    return f"Job {unquote(job_id)} · gpulens" if job_id else "Job · gpulens"


def lifetime_state(context: Context, job_id: str, query: Mapping[str, Any]) -> ViewState:
    """The page's range: the URL's where it names one, else the job's own lifetime, from its first minute to its
    last (or to now while it runs), found among the jobs of the last ``LIFETIME_LOOKBACK_S``."""
    state = ViewState.from_query(query)
    if query.get("range") or not job_id:
        return state
    now = context.clock.now()
    try:
        found = context.base.jobs(now - LIFETIME_LOOKBACK_S, now, job_id=job_id)
    except Exception:
        log.debug("job %s: lifetime not found, the default range is used", job_id, exc_info=True)
        return state
    if not found:
        return state
    job = found[0]
    start = job.first_seen - job.first_seen % 60
    end = job.last_seen + (-job.last_seen) % 60
    running = now - job.last_seen < RUNNING_WITHIN_S
    end = max(end, start + 60)
    return replace(state, range=CUSTOM, start=_minute(start), end="" if running else _minute(end))


def _minute(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M")


def layout(job_id: str = "", *, context: Context | None = None, **query: Any) -> html.Div:
    name = unquote(job_id)
    state = lifetime_state(context, name, query) if context is not None else ViewState.from_query(query)
    return html.Div(
        [
            page_header(f"Job {name}", html.Span(id=ids.JOB_INFO), IDS, state),
            html.Div(id=IDS.status),
            incident_panel(ids.JOB_INCIDENTS, {"job_id": name}, "Incidents hurting this job"),
            html.Div(id=ids.JOB_CHARTS),
            html.Div(id=ids.JOB_FABRIC),
            panel("Alerts about this job", html.Div(id=ids.JOB_ALERTS)),
            panel("GPUs", html.Div(id=ids.JOB_GPUS)),
            html.Div(name, id=ids.JOB_ID, hidden=True),
        ]
    )


def register(app: Dash, context: Context) -> None:
    def page(job_id: str = "", **query: Any) -> html.Div:
        return layout(job_id, context=context, **query)

    register_page(__name__, path_template=PATH_TEMPLATE, title=title, name="Job", layout=page)
    register_toolbar(app, IDS)
    register_incident_panel(app, context, ids.JOB_INCIDENTS, IDS)

    @app.callback(
        Output(IDS.status, "children"),
        Output(ids.JOB_INFO, "children"),
        Output(ids.JOB_CHARTS, "children"),
        Output(ids.JOB_GPUS, "children"),
        Output(ids.JOB_ALERTS, "children"),
        Output(ids.JOB_FABRIC, "children"),
        Output(IDS.updated, "children"),
        *toolbar_inputs(IDS),
        State(ids.JOB_ID, "children"),
        State(IDS.refresh, "value"),
    )
    def update(range_: str, start: str, end: str, _tick: int | None, job_id: str, refresh: str) -> tuple[Any, ...]:
        state = view_state(range_, start, end, refresh)
        try:
            return render(context, state, job_id)
        except PageError as problem:
            return problem.banner, "", [], None, None, [], problem.as_of


def render(context: Context, state: ViewState, job_id: str) -> tuple[Any, ...]:
    now = context.clock.now()
    reader = context.alerts

    def load() -> tuple[Any, ...]:
        span = resolve_range(state.range, state.start, state.end, now, history_start=context.history_start(state.range))
        found = context.store.jobs(span.start, span.end, job_id=job_id)
        summary = found[0] if found else None
        if summary is None:
            return span, None, [], {}, [], [], (None, None, None), ([], ([], (None, "")))
        places = {g.uuid: g for g in context.store.gpu_info(uuids=summary.gpus)}
        points = max(60, min(600, POINT_BUDGET // max(1, len(summary.gpus))))
        series = context.store.series(summary.gpus, FIELDS, span.start, span.end, points)
        active = reader.active() if reader is not None else []
        history = reader.history(span.start, span.end) if reader is not None else []
        host = read_job_host(context.store, job_id, list(places.values()), span.start, span.end)
        store = context.store  # the page view's one session
        # the job's stored accounting summary: one row (computing one reads every raw sample of the job's life)
        account = attempt(lambda: store.job_account(job_id))
        nccl = read_nccl(store, job_id, span.start, span.end)
        bandwidth = (
            read_bandwidth(store, job_id, span.start, span.end),
            link_ceiling(host.ports, list(places.values())),
        )
        meta = attempt(lambda: store.job_info([job_id]).get(job_id))
        return span, summary, list(places.values()), series, active, history, (host, account, meta), (nccl, bandwidth)

    span, summary, places, series, active, history, (host, account, meta), (nccl, bandwidth) = guarded(context, load)
    updated = f"as of {minute_text(now)} · {span.label}"
    if summary is None:
        note = " It may have run outside the range: try a longer one."
        return banner("info", f"No GPU held by job {job_id!r} in this range.", note), "", [], None, None, [], updated
    gpus = sorted(places, key=lambda g: (natural_key(g.node), g.gpu))
    periods = job_periods(history, job_id, now=now)
    rows = [_row(g.node, g.gpu, series.get(g.uuid)) for g in gpus]
    charts = [
        graph_panel(
            ids.JOB_UTILIZATION,
            "Utilization of each GPU",
            gpu_time_heatmap([r[0] for r in rows], _UTIL, start=span.start, end=span.end, bins=BINS, periods=periods),
        ),
        graph_panel(
            ids.JOB_NVLINK,
            "NVLink traffic of each GPU (busier direction, of the link maximum)",
            gpu_time_heatmap(
                [r[1] for r in rows],
                _NVLINK,
                start=span.start,
                end=span.end,
                bins=BINS,
                periods=periods,
                autoscale=True,
            ),
        ),
        graph_panel(
            ids.JOB_POWER,
            "Power of each GPU (of its limit)",
            gpu_time_heatmap([r[2] for r in rows], _POWER, start=span.start, end=span.end, bins=BINS, periods=periods),
        ),
    ]
    mine = [a for a in active if job_id in alert_jobs(a.labels)]
    marks = [flag(f) for f in FLAG_ORDER if f in job_flags(mine).get(job_id, set())]
    info = html.Span(
        [
            scheduler_text(None if isinstance(meta, Missing) else meta),
            f"{summary.user or 'unknown user'} · {len(summary.gpus)} GPUs on {len(summary.nodes)} node(s) · "
            f"{minute_text(summary.first_seen)} to {minute_text(summary.last_seen)} · "
            f"{summary.gpu_hours:.1f} GPU-hours · mean utilization {percent_text(summary.utilization_ratio_mean)} ",
            *marks,
            *_account_line(None if isinstance(account, Missing) else account),
            not_available(missing_of(meta, account, nccl)),  # what the store cannot tell of the job, in one line
        ]
    )
    gpu_rows: list[list[Cell]] = [
        [
            link(gpu_label(g.node, g.gpu), gpu_path(g.uuid), state),
            link(g.node, node_path(g.node), state),
            percent_text(_mean(util.values)),
            percent_text(_mean(nvlink.values)),
            percent_text(_mean(power.values)),
        ]
        for g, (util, nvlink, power) in zip(gpus, rows, strict=True)
    ]
    numeric = ["mean util", "mean NVLink", "mean power"]
    gpu_table = table(["GPU", "node", *numeric], gpu_rows, numeric=numeric)
    episodes = fired_newest_first([e for e in history if job_id in alert_jobs(e.labels)])
    status = None
    if reader is None:
        status = banner("info", "No alert store connected:", " stall and straggler periods cannot be marked.")
    elif marks:
        summaries = [a.summary or a.rule for a in mine if a.state == "firing" and a.rule in JOB_FLAGS]
        status = banner("bad", "The alert engine flags this job.", None, summaries)
    alerts = alerts_table(episodes, state, empty="no alert about this job fired in this range")
    fabric = job_host_panels(host, start=span.start, end=span.end, bins=BINS, periods=periods)
    stuck = nccl_panel(nccl, state, accused_ranks([*active, *history], job_id))
    measured = bandwidth_panel(bandwidth[0], bandwidth[1], state)
    if measured is not None:  # NCCL's measure of its collectives, before the hardware's
        fabric = [measured, *fabric]
    if stuck is not None:  # NCCL's own view first: it names the ranks a hang waits for
        fabric = [stuck, *fabric]
    return status, info, charts, gpu_table, alerts, fabric, updated


def _account_line(account: JobAccount | None) -> list[Any]:
    return [] if account is None else [html.Br(), account_text(account)]


def account_text(account: JobAccount) -> str:
    """``Accounting: 0.33 GPU-hours · 0.150 kWh · idle 50% · stalled 2m30s · 0.71 EUR · 60 g CO2e``"""
    parts = [f"{account.gpu_hours:.2f} GPU-hours"]
    if account.energy_kwh is not None:
        parts.append(f"{account.energy_kwh:.3f} kWh")
    if account.idle_ratio is not None:
        parts.append(f"idle {percent_text(account.idle_ratio)}")
    if account.memory_peak_bytes is not None:
        parts.append(f"peak memory {account.memory_peak_bytes / 2**30:.1f} GiB")
    parts.append(f"stalled {format_duration(account.stall_seconds)}" if account.stall_seconds else "never stalled")
    parts.append(f"{account.cost:.2f} {account.currency}")
    if account.carbon_gco2e is not None:
        parts.append(f"{account.carbon_gco2e:.0f} g CO2e")
    return ("Accounting (ended): " if account.ended else "Accounting (so far): ") + " · ".join(parts)


def _row(node: str, index: int, data: SeriesData | None) -> tuple[Row, Row, Row]:
    label = gpu_label(node, index)
    if data is None:
        empty = Row(label, [], [])
        return empty, empty, empty
    v = data.values
    nvlink = [
        share(busiest_direction(tx, rx), nvlink_max_bytes_per_second(int(n) if n else None))
        for tx, rx, n in zip(
            v["nvlink_tx_bytes_per_second"], v["nvlink_rx_bytes_per_second"], v["nvlink_links_active"], strict=True
        )
    ]
    power = [power_limit_ratio(p, lim) for p, lim in zip(v["power_watts"], v["power_limit_watts"], strict=True)]
    return (
        Row(label, data.timestamps, v["utilization_ratio"]),
        Row(label, data.timestamps, nvlink),
        Row(label, data.timestamps, power),
    )


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def scheduler_text(meta: JobInfo | None) -> str:
    """What the scheduler calls the job: "name (account, partition, array 40_1) · ", or "" where it was not asked."""
    if meta is None:
        return ""
    extra = [x for x in (meta.account, meta.partition) if x]
    if meta.array_job_id is not None:
        extra.append(f"array {meta.array_job_id}_{meta.array_task_id}")
    detail = f" ({', '.join(extra)})" if extra else ""
    return f"{meta.name or 'unnamed'}{detail} · "
