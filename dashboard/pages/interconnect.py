"""Interconnect (``/interconnect``): PCIe and NVLink throughput of every GPU against its link maximum, degraded links,
link error counters, one node's GPU-to-GPU topology with its RDMA ports beside their GPUs, its link errors over the
range, and the fabric: every InfiniBand/RoCE port with its state, traffic against its rate, error and wait rates.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Final

from dash import Dash, Input, Output, State, dcc, html

from gpulens.dashboard import atonce, ids
from gpulens.dashboard.components import (
    GRAPH_CONFIG,
    Cell,
    ViewState,
    banner,
    flag,
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
    NO_PORTS,
    PortStatus,
    Unavailable,
    available,
    error_rates,
    firing_on_ports,
    newest_by_node,
    port_statuses,
    ranked_ports,
    stale_of,
)
from gpulens.dashboard.fabricview import PORT_ROWS, PORT_TABLE_FIELDS, ports_table
from gpulens.dashboard.figures.links import link_load, node_topology, pcie_degraded
from gpulens.dashboard.figures.style import empty_figure, palette_color
from gpulens.dashboard.figures.timeseries import PER_SECOND, Line, time_series
from gpulens.dashboard.formatting import gpu_label
from gpulens.dashboard.grid import natural_key
from gpulens.dashboard.panels import ERROR_FIELDS
from gpulens.dashboard.paths import gpu_path, node_path
from gpulens.dashboard.timerange import minute_text, resolve_range
from gpulens.fabricmodel import NicReading, parse_nic_id
from gpulens.model import GpuReading
from gpulens.ratios import link_loads
from gpulens.storage.reading import TooManySeriesError
from gpulens.storage.records import LINK_ERROR_FIELDS, LinkOutage, SeriesData

PATH: Final = "/interconnect"
IDS: Final = ids.INTERCONNECT
TOP: Final = 25
# What the page draws of every GPU: the link-load chart's throughputs against the links' ceilings (a store that reads
# only the fields asked for, as Prometheus does, would otherwise put every GPU at 0 %), the degraded links and the
# error totals.
LINK_FIELDS: Final = (
    *("pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second"),
    *("nvlink_tx_bytes_per_second", "nvlink_rx_bytes_per_second"),
    "pcie_link_generation",
    "pcie_link_generation_max",
    "pcie_link_width",
    "pcie_link_width_max",
    "nvlink_links_active",
    *LINK_ERROR_FIELDS,
)


def layout(**query: Any) -> html.Div:
    state = ViewState.from_query(query)
    node = str(query.get("node") or "")[:200]
    return html.Div(
        [
            page_header(
                "Interconnect", "PCIe, NVLink and the fabric: load, degraded links, errors, topology", IDS, state
            ),
            html.Div(id=IDS.status),
            html.Div(
                className="gl-two",
                children=[
                    panel(
                        "Every GPU against its link maximums (now)",
                        html.Div(
                            "Shaded: how many GPUs in each cell. Points: the busiest GPUs (click for one). "
                            "The right and top edges are saturated.",
                            className="gl-hint",
                        ),
                        graph(ids.IC_THROUGHPUT),
                    ),
                    panel(
                        "Node topology",
                        graph(ids.IC_TOPOLOGY),
                        html.Div(id=ids.IC_TOPOLOGY_NOTE, className="gl-hint"),
                        controls=dcc.Dropdown(
                            id=ids.IC_NODE,
                            # The URL's node is an option from the start: a value outside the options is dropped.
                            options=[{"label": node, "value": node}] if node else [],
                            value=node or None,
                            placeholder="choose a node",
                            style={"width": "220px"},
                        ),
                    ),
                ],
            ),
            panel("Fabric ports: InfiniBand and RoCE (now)", html.Div(id=ids.IC_FABRIC)),
            html.Div(
                className="gl-two",
                children=[
                    panel("Degraded links (now)", html.Div(id=ids.IC_DEGRADED)),
                    panel("Link errors", html.Div(id=ids.IC_ERRORS)),
                ],
            ),
        ]
    )


def register(app: Dash, context: Context) -> None:
    register_page(__name__, path=PATH, title="Interconnect · gpulens", name="Interconnect", layout=layout)
    register_toolbar(app, IDS, [(ids.IC_NODE, "value", "node")])
    register_click_through(app, IDS, ids.IC_THROUGHPUT)
    register_click_through(app, IDS, ids.IC_TOPOLOGY)

    @app.callback(
        Output(IDS.status, "children"),
        Output(ids.IC_THROUGHPUT, "figure"),
        Output(ids.IC_NODE, "options"),
        Output(ids.IC_NODE, "value"),
        Output(ids.IC_TOPOLOGY, "figure"),
        Output(ids.IC_DEGRADED, "children"),
        Output(ids.IC_ERRORS, "children"),
        Output(ids.IC_FABRIC, "children"),
        Output(ids.IC_TOPOLOGY_NOTE, "children"),
        Output(IDS.updated, "children"),
        *toolbar_inputs(IDS),
        Input(ids.IC_NODE, "value"),
        State(IDS.refresh, "value"),
    )
    def update(range_: str, start: str, end: str, _tick: int | None, node: str | None, refresh: str) -> tuple[Any, ...]:
        state = view_state(range_, start, end, refresh)
        try:
            return render(context, state, node)
        except PageError as problem:
            blank = empty_figure("no data")
            return problem.banner, blank, [], node, blank, None, None, None, None, problem.as_of


def render(context: Context, state: ViewState, node: str | None) -> tuple[Any, ...]:
    now = context.clock.now()

    def load() -> tuple[Any, ...]:
        span = resolve_range(state.range, state.start, state.end, now, history_start=context.history_start(state.range))
        store = context.store
        # the reads that need nothing read before begin at once where the store allows it (dashboard.atonce)
        outages_of = atonce.start(store, lambda: context.store.link_outages(span.start, span.end))
        problems_of = atonce.start(store, lambda: available(lambda: context.store.nic_problems(span.start, span.end)))
        # where the store keeps every GPU's link loads (Prometheus's recording rules), each node's newest sample
        # comes with them, and the link fields are read only of the GPUs it names (degraded, most errors) and of the
        # chosen node's
        summary = store.link_summary(TOP)
        named = [] if summary is not None else context.store.latest_readings(fields=LINK_FIELDS)
        seen = newest_by_node(named) if summary is None else summary.seen
        nodes = sorted(seen, key=natural_key)
        chosen = node if node in nodes else (nodes[0] if nodes else None)
        if summary is not None:
            of_named = atonce.start(store, lambda: _link_readings(context, uuids=summary.named))
            of_node = _link_readings(context, node=chosen)
            merged = {r.uuid: r for r in [*of_named(), *of_node]}
            named = sorted(merged.values(), key=lambda r: (r.node, r.gpu))  # as ``latest_readings`` orders them
        mine = [r for r in named if r.node == chosen]
        series = context.store.series([r.uuid for r in mine], LINK_ERROR_FIELDS, span.start, span.end, 240)
        outages = outages_of()
        firing = firing_on_ports(context.alerts.active()) if context.alerts is not None else {}
        stale = stale_of(seen, now, context.stale_after_s)
        # every port's problems told by the store; only the ports of the rows shown (and the chosen node's) read whole
        problems = problems_of()
        shown = [] if isinstance(problems, Unavailable) else ranked_ports(problems, firing, stale)[:PORT_ROWS]
        wanted = sorted({key[0] for key in map(parse_nic_id, shown) if key} | ({chosen} if chosen else set()))
        nics = (
            problems
            if isinstance(problems, Unavailable)
            else available(lambda: context.store.latest_nics(nodes=wanted, fields=PORT_TABLE_FIELDS))
        )
        listed = frozenset(shown)
        rows = nics if isinstance(nics, Unavailable) else [n for n in nics if n.id in listed]
        rates = _error_rates(context, rows, span.start, span.end)
        statuses = _shown(problems, shown, nics, rates, firing, stale)
        return span, nodes, stale, named, summary, chosen, series, outages, nics, rates, statuses, problems

    span, nodes, stale, named, summary, chosen, series, outages, nics, rates, statuses, problems = guarded(
        context, load
    )
    fresh = [r for r in named if now - r.timestamp <= context.stale_after_s]
    # recorded: every GPU up at the rules' last evaluation, of the nodes reporting now
    loads = link_loads(fresh) if summary is None else [load for load in summary.loads if load.node not in stale]
    status = None
    if not nodes:
        status = banner("info", "No data yet.", " The collector has stored no reading in this database.")
    node_readings = [r for r in named if r.node == chosen]
    down_now: dict[str, int] = defaultdict(int)
    for outage in outages:
        if outage.until is None:
            down_now[outage.uuid] += 1
    node_nics = [] if isinstance(nics, Unavailable) else [n for n in nics if n.node == chosen]
    topology = (
        node_topology(node_readings, down_now, node_nics) if node_readings else empty_figure("no node chosen", 380)
    )
    errors = html.Div(
        [
            html.Div(f"{chosen}: error rates over the range" if chosen else "", className="gl-hint"),
            error_chart(node_readings, series, span.start, span.end),
            html.Div("Highest error counts on the cluster (since each exporter started)", className="gl-hint"),
            error_totals(fresh, state),
        ]
    )
    return (
        context.with_recording_notice(status),
        link_load(loads),
        [{"label": n, "value": n} for n in nodes],
        chosen,
        topology,
        degraded_table(fresh, outages, state, None if summary is None else summary.best_links),
        errors,
        ports_table(
            statuses,
            state,
            rates_note=rates.reason if isinstance(rates, Unavailable) else None,
            counts=None if isinstance(problems, Unavailable) else _counts(problems),
        ),
        topology_note(chosen, nics, node_nics),
        f"as of {minute_text(now)} · {span.label}"
        + (f" · link loads recorded {minute_text(summary.timestamp)}" if summary is not None else ""),
    )


def _link_readings(context: Context, *, uuids: Sequence[str] = (), node: str | None = None) -> list[GpuReading]:
    """The link fields of the GPUs ``uuids`` or of ``node``'s (none where neither is given)."""
    if not uuids and node is None:
        return []
    return context.store.latest_readings(node=node, uuids=uuids or None, fields=LINK_FIELDS)


def _error_rates(
    context: Context, nics: list[NicReading] | Unavailable, start: float, end: float
) -> dict[str, float] | Unavailable:
    """The error rates of the ports that counted errors (one query), or why they cannot be read."""
    if isinstance(nics, Unavailable):
        return nics
    try:
        return available(lambda: error_rates(context.store, nics, start, end))
    except TooManySeriesError:
        return Unavailable("too many ports with errors to read their rates; totals are in each port's counters")


def _rates_of(rates: dict[str, float] | Unavailable) -> dict[str, float] | None:
    return None if isinstance(rates, Unavailable) else rates


def _shown(
    problems: Mapping[str, Sequence[str]] | Unavailable,
    shown: Sequence[str],
    nics: list[NicReading] | Unavailable,
    rates: dict[str, float] | Unavailable,
    firing: Mapping[str, Sequence[str]],
    stale: Collection[str],
) -> list[PortStatus] | Unavailable:
    """The statuses of the ports shown, in their rank (their nodes' ports read whole: a port's best rate and width
    are its node's)."""
    if isinstance(problems, Unavailable):
        return problems
    if isinstance(nics, Unavailable):
        return nics
    by_id = {s.nic.id: s for s in port_statuses(nics, _rates_of(rates), firing, stale)}
    return [by_id[nic] for nic in shown if nic in by_id]


def _counts(problems: Mapping[str, Sequence[str]]) -> tuple[int, int]:
    """(ports, ports down) of the cluster."""
    return len(problems), sum(1 for found in problems.values() if "down" in found)


def topology_note(chosen: str | None, nics: list[NicReading] | Unavailable, mine: list[NicReading]) -> str:
    """Under the topology: the chosen node's ports in a line, or why none are drawn."""
    if chosen is None:
        return ""
    if isinstance(nics, Unavailable):
        return f"RDMA ports: {nics.reason}"
    if not mine:
        return f"{chosen}: {NO_PORTS}"
    up = sum(1 for n in mine if n.up)
    return (
        f"{chosen}: {up} of {len(mine)} RDMA ports up, each drawn outside the GPUs it sits next to (dotted: "
        "PCIe affinity; colour: green carrying traffic, pale idle, amber degraded, red down; label: the busier "
        "direction of its rate)"
    )


def degraded_links(
    readings: Sequence[GpuReading], best_links: Mapping[str, int] | None = None
) -> list[tuple[GpuReading, str]]:
    """GPUs whose PCIe link trained below its maximum, or with fewer active NVLinks than their model's best (of
    ``readings``, or ``best_links`` where the store told it of every GPU)."""
    best: dict[str, int] = defaultdict(int, best_links or {})
    for r in readings:
        best[r.model] = max(best[r.model], r.nvlink_links_active or 0)
    found = []
    for r in readings:
        if not r.up:
            continue
        if pcie_degraded(r):
            found.append(
                (
                    r,
                    f"PCIe Gen{r.pcie_link_generation} x{r.pcie_link_width} "
                    f"(max Gen{r.pcie_link_generation_max} x{r.pcie_link_width_max})",
                )
            )
        active = r.nvlink_links_active
        if active is not None and active < best[r.model]:
            found.append((r, f"NVLink {active} of {best[r.model]} links active"))
    return found


def degraded_table(
    readings: Sequence[GpuReading],
    outages: Sequence[LinkOutage],
    state: ViewState,
    best_links: Mapping[str, int] | None = None,
) -> html.Div:
    """Links below their maximum now, and the NVLinks reported down in the range (with the link number)."""
    rows: list[list[Cell]] = [
        [
            link(gpu_label(r.node, r.gpu), gpu_path(r.uuid), state),
            link(r.node, node_path(r.node), state),
            flag(what, "down"),
            "now",
        ]
        for r, what in degraded_links(readings, best_links)
    ]
    for o in outages:
        until = "still down" if o.until is None else f"to {minute_text(o.until)}"
        remote = f" (to {o.remote_pci_bus_id})" if o.remote_pci_bus_id else ""
        rows.append(
            [
                link(gpu_label(o.node, o.gpu), gpu_path(o.uuid), state),
                link(o.node, node_path(o.node), state),
                flag(f"NVLink {o.link} inactive{remote}", "down" if o.until is None else "resolved"),
                f"{minute_text(o.since)} {until}",
            ]
        )
    return table(["GPU", "node", "link", "when"], rows, empty="every link at its maximum in this range")


def error_totals(readings: Sequence[GpuReading], state: ViewState) -> html.Div:
    scored = []
    for r in readings:
        counts = {
            "PCIe replays": r.pcie_replays_total,
            "NVLink CRC": r.nvlink_crc_flit_errors_total,
            "NVLink replay": r.nvlink_replay_errors_total,
            "NVLink recovery": r.nvlink_recovery_errors_total,
        }
        total = sum(v or 0 for v in counts.values())
        if total:
            scored.append((total, r, counts))
    scored.sort(key=lambda s: -s[0])
    rows: list[list[Cell]] = [
        [
            link(gpu_label(r.node, r.gpu), gpu_path(r.uuid), state),
            *(f"{v:,}" if v else "0" for v in counts.values()),
        ]
        for _, r, counts in scored[:TOP]
    ]
    return table(
        ["GPU", "PCIe replays", "NVLink CRC", "NVLink replay", "NVLink recovery"],
        rows,
        numeric=["PCIe replays", "NVLink CRC", "NVLink replay", "NVLink recovery"],
        empty="no link error counted",
    )


def error_chart(
    readings: Sequence[GpuReading], series: Mapping[str, SeriesData], start: float, end: float
) -> dcc.Graph:
    lines = []
    for r in sorted(readings, key=lambda r: r.gpu):
        data = series.get(r.uuid)
        if data is None:
            continue
        for i, name in enumerate(LINK_ERROR_FIELDS):
            values = data.values.get(name, ())
            if any(values):
                lines.append(
                    Line(
                        f"GPU {r.gpu} {ERROR_FIELDS[name]}",
                        data.timestamps,
                        values,
                        color=palette_color(r.gpu),
                        dash=None if i == 0 else "dot",
                    )
                )
    figure = time_series(lines, PER_SECOND, start=start, end=end, height=220, empty="no link errors in this range")
    return dcc.Graph(id=ids.IC_ERROR_CHART, figure=figure, config=GRAPH_CONFIG)
