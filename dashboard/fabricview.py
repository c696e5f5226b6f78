"""The fabric's HTML pieces the pages share: the table of every RDMA port (interconnect), the per-node fabric column
(overview), the load bars they draw traffic against a port's rate with, and the honest words for a gap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from dash import dcc, html

from gpulens.dashboard.components import Cell, ViewState, card, flag, href, table
from gpulens.dashboard.fabric import (
    NO_PORTS,
    SATURATED_AT,
    STATUS_FIELDS,
    NodeFabric,
    PortStatus,
    Unavailable,
    gbit_text,
    gpus_text,
)
from gpulens.dashboard.figures.style import IDLE_LINK_BELOW
from gpulens.dashboard.formatting import MISSING, percent_text, rate_text
from gpulens.fabricmodel import NicReading

INTERCONNECT_PATH: Final = "/interconnect"
PORT_COLUMNS: Final = (
    "node",
    "NIC",
    "link",
    "state",
    "rate",
    "TX of rate",
    "RX of rate",
    "errors/s",
    "wait/s",
    "GPUs",
    "problems",
)
NUMERIC: Final = ("rate", "errors/s", "wait/s")
PROBLEM_TONE: Final = {
    "down": "down",
    "degraded": "down",
    "errors": "down",
    "saturated": "warning",
    "stale": "stale",
}
# The port fields ``ports_table`` shows (what the interconnect page asks ``latest_nics`` for).
PORT_TABLE_FIELDS: Final = (*STATUS_FIELDS, "link_speed", "transmit_wait_per_second")
PORT_ROWS: Final = 100  # problems come first, so the first hundred ports hold every one worth reading


def gap_text(nics: Sequence[NicReading] | Unavailable, what: str = "fabric") -> str | None:
    """What a fabric panel says instead of its data: the backend cannot give it, or no port is known."""
    if isinstance(nics, Unavailable):
        return f"{what}: {nics.reason}"
    return None if nics else NO_PORTS


def count_rate_text(value: float | None) -> str:
    """Events per second, compactly: ``0``, ``0.25``, ``12``, ``3.4k``."""
    if value is None:
        return MISSING
    if value == 0:
        return "0"
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.3g}"


def load_bar(ratio: float | None, detail: str = "") -> html.Div | str:
    """A bar as long as ``ratio`` of the cell with its percentage: green carrying traffic, amber from 90 % (saturated),
    its text pale under 1 % (idle: ``style.link_state``). Red is kept for a port that is down."""
    if ratio is None:
        return MISSING
    tone = "warn" if ratio >= SATURATED_AT else "idle" if ratio < IDLE_LINK_BELOW else "ok"
    width = f"{max(0.0, min(1.0, ratio)) * 100:.0f}%"
    return html.Div(
        className=f"gl-bar {tone}",
        title=detail or None,
        children=[
            html.Span(className="gl-bar-track", children=html.Span(className="gl-bar-fill", style={"width": width})),
            html.Span(percent_text(ratio), className="gl-bar-text"),
        ],
    )


def _layer(n: NicReading) -> str:
    kind = "RoCE" if n.is_roce else "IB" if n.link_layer else MISSING
    lanes = f" {n.link_width}X {n.link_speed or ''}".rstrip() if n.link_width else ""
    return kind + lanes


def _state(n: NicReading, stale: bool) -> html.Span:
    text = "up" if n.up else "down"
    title = f"{n.state or '?'} / {n.phys_state or '?'}" + (": its node's last reading, not recent" if stale else "")
    return html.Span(text, className=f"gl-flag {'stale' if stale else text}", title=title)


def _problems(s: PortStatus) -> list[Cell]:
    cells: list[Cell] = []
    for p in s.problems:
        label = f"degraded: {s.degraded_detail}" if p == "degraded" else p
        if p == "stale":
            label = "stale: no recent reading"
        cells.append(flag(label, f"{PROBLEM_TONE[p]} {p}"))
    cells += [flag(rule, "firing") for rule in s.alerts]
    return cells


def ports_table(
    statuses: Sequence[PortStatus] | Unavailable,
    state: ViewState,
    *,
    rates_note: str | None = None,
    counts: tuple[int, int] | None = None,
) -> html.Div:
    """Every port, problems first: state, rate, traffic against its rate, error and wait rates, its GPUs.

    ``counts``: (ports, ports down) of the cluster where ``statuses`` are only the first of them (the rows shown)."""
    if isinstance(statuses, Unavailable):
        return html.Div(f"fabric: {statuses.reason}", className="gl-empty")
    total, down = counts if counts is not None else (len(statuses), sum(1 for s in statuses if not s.nic.up))
    if not total:
        return html.Div(NO_PORTS, className="gl-empty")
    rows: list[list[Cell]] = []
    classes = []
    for s in statuses[:PORT_ROWS]:  # components for the rows sent only: 8,000 ports would cost seconds
        n = s.nic
        stale = "stale" in s.problems
        rows.append(
            [
                node_link(n.node, state),
                f"{n.device}/{n.port}",
                _layer(n),
                _state(n, stale),
                gbit_text(n.rate_bytes_per_second),
                load_bar(s.tx_ratio, rate_text(n.transmit_bytes_per_second)),
                load_bar(s.rx_ratio, rate_text(n.receive_bytes_per_second)),
                count_rate_text(s.error_rate),
                MISSING if stale else count_rate_text(n.transmit_wait_per_second),
                gpus_text(n.gpus) or MISSING,
                html.Span(_problems(s)) if s.problems or s.alerts else "",
            ]
        )
        classes.append("flagged" if "down" in s.problems else "")
    hint = f"{total} ports · {down} down · problems first"
    if total > PORT_ROWS:
        hint += f" · showing the first {PORT_ROWS}"
    if rates_note:
        hint += f" · error rates: {rates_note}"
    return html.Div(
        [
            html.Div(hint, className="gl-hint"),
            table(
                PORT_COLUMNS, rows, numeric=NUMERIC, row_classes=classes, table_id="ic-fabric-table", limit=PORT_ROWS
            ),
        ]
    )


def node_link(node: str, state: ViewState) -> dcc.Link:
    """The node's name, opening its fabric topology on the interconnect page."""
    return dcc.Link(node, href=href(INTERCONNECT_PATH, state, node=node))


def fabric_card(summaries: Mapping[str, NodeFabric] | Unavailable) -> html.Div:
    """The overview's headline card: ports up of all, cluster-wide."""
    if isinstance(summaries, Unavailable):
        return card("Fabric ports up", MISSING, summaries.reason)
    if not summaries:
        return card("Fabric ports up", MISSING, "no RDMA ports read")
    fresh = [s for s in summaries.values() if not s.stale]
    up = sum(s.up for s in fresh)
    total = sum(s.total for s in fresh)
    down = total - up
    detail = f"{down} down" if down else "all up"
    stale = sum(s.total for s in summaries.values() if s.stale)
    if stale:
        detail += f" · {stale} stale"
    return card("Fabric ports up", f"{up:,}/{total:,}", detail, "bad" if down else "ok")


def node_fabric_table(
    nodes: Sequence[str], summaries: Mapping[str, NodeFabric] | Unavailable, state: ViewState
) -> html.Div:
    """The fabric column of the overview, for the nodes its heatmap shows: NICs up of all, the busiest port's
    load, errors, the problems; a node with no port read says so."""
    if isinstance(summaries, Unavailable):
        return html.Div(f"fabric: {summaries.reason}", className="gl-empty")
    if not summaries:
        return html.Div(NO_PORTS, className="gl-empty")
    rows: list[list[Cell]] = []
    classes = []
    for node in nodes:
        s = summaries.get(node)
        name = node_link(node, state)
        if s is None:
            rows.append([name, html.Span("no RDMA ports read", className="gl-hint"), "", "", ""])
            classes.append("")
            continue
        tone = "stale" if s.stale else "up" if s.up == s.total else "down"
        up = html.Span(f"{s.up}/{s.total}", className=f"gl-flag {tone}")
        problems = [flag(p, f"{PROBLEM_TONE[p]} {p}") for p in s.problems if p not in ("errors", "stale")]
        if s.stale:
            problems.append(flag("stale: no recent reading", "stale"))
        rows.append(
            [
                name,
                up,
                load_bar(s.worst_load),
                flag("errors", "down") if s.errors else html.Span("none", className="gl-hint"),
                html.Span(problems) if problems else "",
            ]
        )
        classes.append("flagged" if s.up < s.total and not s.stale else "")
    return table(
        ["node", "NICs up", "busiest NIC", "errors", "problems"],
        rows,
        row_classes=classes,
        table_id="overview-fabric-table",
        empty="no node on this page",
    )
