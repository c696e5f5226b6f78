"""Overview (``/``): headline figures, the node x GPU heatmap by a chosen metric, the fabric of the nodes it shows
(RDMA ports up of all, the busiest port, errors), scrape-target health.

At 1,000 nodes the heatmap pages through the nodes (filtered by name, sorted by name, value or problems) and a
cluster map above it shows every node as one cell; a click on the map jumps to the node's page of the heatmap, a
click on a heatmap cell opens the GPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from dash import Dash, Input, Output, State, ctx, dcc, html

from gpulens.alerts.state import AlertState
from gpulens.dashboard import atonce, ids
from gpulens.dashboard.alertdata import counts_as_firing
from gpulens.dashboard.components import (
    Cell,
    ViewState,
    banner,
    card,
    color_key,
    graph,
    link,
    page_header,
    panel,
    register_click_through,
    register_page,
    register_toolbar,
    table,
    toolbar_inputs,
    view_state,
)
from gpulens.dashboard.context import Context, PageError, guarded
from gpulens.dashboard.fabric import (
    STATUS_FIELDS,
    NodeFabric,
    Unavailable,
    available,
    error_rates,
    firing_on_ports,
    node_fabric,
    port_statuses,
    stale_nodes,
)
from gpulens.dashboard.fabricview import fabric_card, node_fabric_table
from gpulens.dashboard.figures.grids import cluster_map, gpu_heatmap
from gpulens.dashboard.figures.style import HEALTH_COLORS, empty_figure
from gpulens.dashboard.formatting import MISSING, bytes_text, percent_text, plotly_text, watts_text
from gpulens.dashboard.grid import DEFAULT_SORT, NODES_PER_PAGE, SORTS, GridPage, grid_cells, parse_page, select_page
from gpulens.dashboard.heatmaps import DEFAULT_METRIC, METRIC_FIELDS, METRICS, Metric
from gpulens.dashboard.hung import hangs
from gpulens.dashboard.incidentview import incident_panel, register_incident_panel
from gpulens.dashboard.paths import job_path, node_path
from gpulens.dashboard.summary import IDLE_BELOW, SUMMARY_FIELDS, Headline, headline
from gpulens.dashboard.timerange import TimeRange, minute_text, resolve_range
from gpulens.fabricmodel import NicReading
from gpulens.model import GpuJob, TargetHealth
from gpulens.nodehealth import DEGRADED, HEALTHY, STATES, UNHEALTHY, NodeHealth
from gpulens.ratios import memory_used_ratio, power_limit_ratio
from gpulens.storage.reading import TooManySeriesError

PATH: Final = "/"
TITLE: Final = "Overview · gpulens"
IDS: Final = ids.OVERVIEW
MAP_COLUMNS: Final = 50


def layout(**query: Any) -> html.Div:
    state = ViewState.from_query(query)
    metric = query.get("metric") if query.get("metric") in METRICS else DEFAULT_METRIC
    sort = query.get("sort") if query.get("sort") in SORTS else DEFAULT_SORT
    controls = html.Div(
        className="gl-controls",
        children=[
            dcc.RadioItems(
                id=ids.OVERVIEW_METRIC,
                className="gl-seg",
                options=[{"label": m.label.split(" (")[0], "value": m.key} for m in METRICS.values()],
                value=metric,
                inline=True,
            ),
            dcc.Dropdown(
                id=ids.OVERVIEW_SORT,
                options=[{"label": f"sort: {text}", "value": key} for key, text in SORTS.items()],
                value=sort,
                clearable=False,
                searchable=False,
                style={"width": "200px"},
            ),
            dcc.Input(
                id=ids.OVERVIEW_FILTER,
                className="gl-input gl-filter",
                placeholder="filter nodes",
                value=str(query.get("q") or "")[:100],
                debounce=True,
                type="text",
            ),
            html.Button("← previous", id=ids.OVERVIEW_PREV, className="gl-button", title="previous nodes"),
            html.Span(id=ids.OVERVIEW_PAGE_INFO, className="gl-hint"),
            html.Button("next →", id=ids.OVERVIEW_NEXT, className="gl-button", title="next nodes"),
        ],
    )
    return html.Div(
        [
            page_header("Cluster overview", None, IDS, state),
            html.Div(id=IDS.status),
            incident_panel(ids.OVERVIEW_INCIDENTS, {}, "Open incidents"),
            html.Div(id=ids.OVERVIEW_CARDS, className="gl-cards"),
            html.Div(
                id=ids.OVERVIEW_MAP_PANEL,
                style={"display": "none"},
                children=panel(
                    "All nodes",
                    html.Div("One cell per node, mean over its GPUs; click to jump to it.", className="gl-hint"),
                    graph(ids.OVERVIEW_MAP),
                ),
            ),
            panel(
                "GPUs by node",
                color_key(
                    [(state, HEALTH_COLORS[state]) for state in STATES],
                    ["a node's dot: its health (gpulens node-health)", "orange cells: hung GPUs (a stalled job's)"],
                ),
                graph(ids.OVERVIEW_HEATMAP),
                controls=controls,
            ),
            panel(
                "Fabric of these nodes",
                html.Div(
                    "InfiniBand and RoCE ports: up of all, the busiest port's busier direction of its rate, errors "
                    "counted in the range. A node opens its topology.",
                    className="gl-hint",
                ),
                html.Div(id=ids.OVERVIEW_FABRIC),
            ),
            panel("Scrape targets", html.Div(id=ids.OVERVIEW_TARGETS)),
            dcc.Store(id=ids.OVERVIEW_PAGE, data=parse_page(query.get("page")) + 1),
            dcc.Store(id=ids.OVERVIEW_PAGES, data=1),
        ]
    )


def register(app: Dash, context: Context) -> None:
    register_page(__name__, path=PATH, title=TITLE, name="Overview", layout=layout)
    register_toolbar(
        app,
        IDS,
        [
            (ids.OVERVIEW_METRIC, "value", "metric"),
            (ids.OVERVIEW_SORT, "value", "sort"),
            (ids.OVERVIEW_FILTER, "value", "q"),
            (ids.OVERVIEW_PAGE, "data", "page"),
        ],
    )
    register_click_through(app, IDS, ids.OVERVIEW_HEATMAP)
    register_incident_panel(app, context, ids.OVERVIEW_INCIDENTS, IDS)

    @app.callback(
        Output(ids.OVERVIEW_PAGE, "data"),
        Input(ids.OVERVIEW_PREV, "n_clicks"),
        Input(ids.OVERVIEW_NEXT, "n_clicks"),
        Input(ids.OVERVIEW_MAP, "clickData"),
        Input(ids.OVERVIEW_SORT, "value"),
        Input(ids.OVERVIEW_FILTER, "value"),
        State(ids.OVERVIEW_PAGE, "data"),
        State(ids.OVERVIEW_PAGES, "data"),
        prevent_initial_call=True,
    )
    def turn_page(
        _prev: int | None, _next: int | None, click: dict[str, Any] | None, _sort: str, _q: str, page: int, count: int
    ) -> int:
        return next_page(ctx.triggered_id, page, count, click)

    @app.callback(
        Output(IDS.status, "children"),
        Output(ids.OVERVIEW_CARDS, "children"),
        Output(ids.OVERVIEW_MAP, "figure"),
        Output(ids.OVERVIEW_MAP_PANEL, "style"),
        Output(ids.OVERVIEW_HEATMAP, "figure"),
        Output(ids.OVERVIEW_PAGE_INFO, "children"),
        Output(ids.OVERVIEW_PREV, "disabled"),
        Output(ids.OVERVIEW_NEXT, "disabled"),
        Output(ids.OVERVIEW_PAGES, "data"),
        Output(ids.OVERVIEW_FABRIC, "children"),
        Output(ids.OVERVIEW_TARGETS, "children"),
        Output(IDS.updated, "children"),
        *toolbar_inputs(IDS),
        Input(ids.OVERVIEW_METRIC, "value"),
        Input(ids.OVERVIEW_SORT, "value"),
        Input(ids.OVERVIEW_FILTER, "value"),
        Input(ids.OVERVIEW_PAGE, "data"),
        State(IDS.refresh, "value"),
    )
    def update(
        range_: str,
        start: str,
        end: str,
        _tick: int | None,
        metric_key: str,
        sort: str,
        text: str | None,
        page: int,
        refresh: str,
    ) -> tuple[Any, ...]:
        state = view_state(range_, start, end, refresh)
        try:
            return render(context, state, metric_key, sort, text or "", page)
        except PageError as problem:
            blank = empty_figure("no data")
            return (problem.banner, [], blank, {"display": "none"}, blank, "", True, True, 1, None, None, problem.as_of)


def next_page(trigger: object, page: int, count: int, click: dict[str, Any] | None) -> int:
    """The 1-based page after a pager click, a map click (the clicked node's page) or a filter change (page 1)."""
    if trigger == ids.OVERVIEW_PREV:
        return max(1, page - 1)
    if trigger == ids.OVERVIEW_NEXT:
        return min(count, page + 1)
    if trigger == ids.OVERVIEW_MAP and click:
        point = click["points"][0]
        index = int(point["y"]) * MAP_COLUMNS + int(point["x"])
        return min(count, index // NODES_PER_PAGE + 1)
    return 1


def render(context: Context, state: ViewState, metric_key: str, sort: str, text: str, page: int) -> tuple[Any, ...]:
    metric = METRICS.get(metric_key, METRICS[DEFAULT_METRIC])
    now = context.clock.now()

    def load() -> tuple[Any, ...]:
        span = resolve_range(state.range, state.start, state.end, now, history_start=context.history_start(state.range))
        store = context.store
        # the reads that need nothing read before begin at once where the store allows it (dashboard.atonce): over
        # Prometheus at 8,000 GPUs the page's data took 0.62 s against 0.70 s in turn (medians of 20 loads, 2026-12-07)
        jobs_of = atonce.start(store, store.current_jobs)
        targets_of = atonce.start(store, store.target_health)
        counts_of = atonce.start(store, lambda: available(store.nic_counts))  # every node's ports counted
        health_of = atonce.start(store, lambda: available(store.node_health))
        # the headline from the nodes' totals where the store keeps them (Prometheus's recording rules): then only
        # the heatmap's fields of every GPU are read
        totals = store.node_totals()
        shown = METRIC_FIELDS.get(metric.key, ())
        readings = store.latest_readings(fields=shown if totals is not None else SUMMARY_FIELDS + shown)
        jobs = jobs_of()
        targets = targets_of()
        firing = context.alerts.active() if context.alerts is not None else None
        cells = grid_cells(readings, jobs, now=now, stale_after_s=context.stale_after_s, alerts=firing or ())
        grid = select_page(cells, metric, text=text, sort=sort, page=page - 1)
        counts = counts_of()
        nics = available(lambda: store.latest_nics(nodes=grid.nodes, fields=STATUS_FIELDS))  # the nodes shown
        stale = stale_nodes(readings, now, context.stale_after_s)
        fabric = fabric_of(context, counts, nics, span, firing, stale)  # in the same snapshot
        health = health_of()
        if not isinstance(health, Unavailable):  # a node with no recent reading: its last verdict is not now's
            health = {node: h for node, h in health.items() if node not in stale}
        return span, targets, firing, cells, grid, fabric, totals, jobs, health

    span, targets, firing, cells, grid, fabric, totals, jobs, health = guarded(context, load)
    judged = {} if isinstance(health, Unavailable) else health
    head = headline(cells, totals)
    alerts_firing = None if firing is None else sum(1 for a in firing if counts_as_firing(a))
    show_map = len(grid.rows) > grid.per_page
    map_figure = node_map(grid, metric) if show_map else empty_figure("")
    heatmap = (
        gpu_heatmap(grid.cells, grid.nodes, metric, show_text=len(grid.nodes) <= 40, health=judged)
        if grid.rows
        else empty_figure("no node matches the filter" if text else "no GPUs yet")
    )
    first = grid.page * grid.per_page + 1
    last = min(len(grid.rows), (grid.page + 1) * grid.per_page)
    info = f"nodes {first} to {last} of {len(grid.rows)} · page {grid.page + 1}/{grid.pages}" if grid.rows else ""
    return (
        [hang_banner(firing or (), jobs, state), status_banner(head, targets, now)],
        [*headline_cards(head, alerts_firing), health_card(health), fabric_card(fabric)],
        map_figure,
        {"display": "block" if show_map else "none"},
        heatmap,
        info,
        grid.page == 0,
        grid.page >= grid.pages - 1,
        grid.pages,
        node_fabric_table(grid.nodes, fabric, state),
        targets_table(targets, state),
        f"as of {minute_text(now)} · {span.label}"
        + (f" · totals recorded {minute_text(head.summed_at)}" if head.summed_at is not None else ""),
    )


def fabric_of(
    context: Context,
    counts: Mapping[str, tuple[int, int]] | Unavailable,
    shown: list[NicReading] | Unavailable,
    span: TimeRange,
    firing: Sequence[AlertState] | None,
    stale: set[str],
) -> dict[str, NodeFabric] | Unavailable:
    """Every node's fabric in a line: the nodes ``shown`` (their ports read whole; the error rates, one query, of
    their ports) from their ports' problems, every other node from its ports ``counts`` (up, all: the card)."""
    if isinstance(counts, Unavailable):
        return counts
    if isinstance(shown, Unavailable):
        return shown
    try:
        rates = available(lambda: error_rates(context.store, shown, span.start, span.end))
    except TooManySeriesError:
        rates = Unavailable()
    known = None if isinstance(rates, Unavailable) else rates
    out = node_fabric(port_statuses(shown, known, firing_on_ports(firing or ()), stale))
    for node, (up, total) in counts.items():
        if node not in out:
            problems = ("stale",) if node in stale else ("down",) if up < total else ()
            out[node] = NodeFabric(node, up, total, None, False, problems)
    return out


def node_map(grid: GridPage, metric: Metric) -> Any:
    """Every node in a cell; a node with hung GPUs marked hung, as the heatmap marks its GPUs."""
    values = []
    hung = set()
    for row in grid.rows:
        state = f"{row.problems} GPU(s) down or stale" if row.problems else f"{len(row.cells)} GPUs"
        value = metric.text(row.value) if row.value is not None else MISSING
        hover = f"<b>{plotly_text(row.node)}</b><br>{metric.label}: {value}<br>{state}"
        held = [c.hung for c in row.cells if c.hung]
        if held:
            hung.add(row.node)
            hover += f"<br><b>{len(held)} GPU(s) {plotly_text(held[0])}</b>"
        values.append((row.node, row.value, hover))
    return cluster_map(values, metric, columns=MAP_COLUMNS, hung=hung)


def headline_cards(h: Headline, alerts_firing: int | None) -> list[html.Div]:
    mem = memory_used_ratio(h.memory_used_bytes, h.memory_total_bytes)
    power = power_limit_ratio(h.power_watts, h.power_limit_watts)
    not_up = h.down + h.stale
    return [
        card("GPUs", f"{h.gpus:,}", f"{h.nodes:,} nodes"),
        card(
            "Up",
            f"{h.up:,}",
            f"{h.down} down · {h.stale} stale" if not_up else "all reporting",
            "bad" if not_up else "ok",
        ),
        card("Busy", f"{h.busy:,}", f"utilization ≥ {IDLE_BELOW:.0%}"),
        card("Idle", f"{h.idle:,}", f"utilization < {IDLE_BELOW:.0%}"),
        card(
            "Allocated but idle", f"{h.allocated_idle:,}", "held by a job, idle", "warn" if h.allocated_idle else None
        ),
        card("Mean utilization", percent_text(h.utilization_ratio_mean), "over GPUs up"),
        card(
            "Memory used",
            percent_text(mem),
            f"{bytes_text(h.memory_used_bytes)} of {bytes_text(h.memory_total_bytes)}",
        ),
        card("Power drawn", watts_text(h.power_watts), f"{percent_text(power)} of limits"),
        card("Alerts firing", MISSING, "no alert store connected")
        if alerts_firing is None
        else card("Alerts firing", f"{alerts_firing}", "see Alerts", "bad" if alerts_firing else "ok"),
    ]


def health_card(health: Mapping[str, NodeHealth] | Unavailable) -> html.Div:
    """How many nodes are healthy of those judged now (``gpulens.nodehealth``; stale nodes are not), and how many
    unhealthy and degraded: ``3/4``, ``1 unhealthy · 0 degraded`` (shortened to fit a card)."""
    if isinstance(health, Unavailable) or not health:
        why = "not kept by this store" if isinstance(health, Unavailable) else "no node has reported it"
        return card("Nodes healthy", MISSING, why)
    count = {state: sum(1 for h in health.values() if h.state == state) for state in STATES}
    tone = "bad" if count[UNHEALTHY] else "warn" if count[DEGRADED] else "ok"
    detail = f"{count[UNHEALTHY]} unhealthy · {count[DEGRADED]} degr."
    return card("Nodes healthy", f"{count[HEALTHY]}/{len(health)}", detail, tone)


def hang_banner(alerts: Sequence[AlertState], jobs: Sequence[GpuJob], state: ViewState) -> html.Div | None:
    """The stalled jobs and hung drivers first, named: their GPUs may read 100 % busy (the heatmap marks them hung)."""
    stalled, drivers = hangs(alerts)
    if not stalled and not drivers:
        return None
    held: dict[str, int] = {}
    for j in jobs:
        held[j.job_id] = held.get(j.job_id, 0) + 1
    items: list[Any] = [
        html.Span(
            [
                "job ",
                link(job, job_path(job), state),
                f": {held.get(job, 0)} GPU(s) hung since {minute_text(h.began)}"
                + (f" ({h.signature})" if h.signature else "")
                + ("" if h.firing else ", pending"),
            ]
        )
        for job, h in sorted(stalled.items())
    ]
    items += [
        html.Span(["node ", link(node, node_path(node), state), f": GPU driver hung since {minute_text(h.began)}"])
        for node, h in sorted(drivers.items())
    ]
    title = f"{len(stalled)} job(s) stalled" if stalled else f"{len(drivers)} node(s) with a hung GPU driver"
    return banner("bad", title + ": their GPUs are hung, not busy.", None, items)


def status_banner(h: Headline, targets: list[TargetHealth], now: float) -> html.Div | None:
    """No data yet, or targets down: said at the top of the page, plainly."""
    down = [t for t in targets if not t.up]
    if h.gpus == 0:
        detail = (
            f" {len(targets)} scrape target(s) known, {len(down)} down."
            if targets
            else " No scrape target has reported."
        )
        return banner(
            "info",
            "No data yet.",
            "The collector has stored no GPU reading in this database." + detail + " Start `gpulens collector`.",
        )
    if down:
        items = [f"{t.target}: {t.last_error or 'down'} (since {minute_text(t.timestamp)})" for t in down[:5]]
        if len(down) > 5:
            items.append(f"... and {len(down) - 5} more (table below)")
        return banner("warn", f"{len(down)} of {len(targets)} scrape targets down.", None, items)
    if h.stale:
        return banner("warn", f"{h.stale} GPU(s) have not reported for a while.", " They show grey in the heatmap.")
    return None


def targets_table(targets: list[TargetHealth], state: ViewState) -> html.Div:
    down_first = sorted(targets, key=lambda t: (t.up, t.target))
    rows: list[list[Cell]] = [
        [
            html.Span("up" if t.up else "down", className=f"gl-flag {'up' if t.up else 'down'}"),
            t.target,
            link(t.node, node_path(t.node), state) if t.node else MISSING,
            t.kind,
            minute_text(t.timestamp),
            f"{t.scrape_duration_seconds * 1000:.0f} ms" if t.scrape_duration_seconds is not None else MISSING,
            f"{t.samples}",
            t.last_error or "",
        ]
        for t in down_first[:50]
    ]
    up = sum(1 for t in targets if t.up)
    summary = html.Div(
        f"{up} of {len(targets)} up" + (" · showing 50, down first" if len(targets) > 50 else ""), className="gl-hint"
    )
    return html.Div(
        [
            summary,
            table(
                ["state", "target", "node", "kind", "last scrape", "duration", "GPUs", "last error"],
                rows,
                numeric=["duration", "GPUs"],
                empty="no scrape target has reported yet",
            ),
        ]
    )
