"""Reports (``/reports``): GPU usage per user, account or partition over the range, the table of ``gpulens report``
(the same computation: ``storage.usagereport`` through the store's ``usage``), and a chart of the idle share of the
allocated GPU time over the range (``storage.idletrend``), for the groups with the most GPU-hours and overall.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Final

import plotly.graph_objects as go
from dash import Dash, Input, Output, State, dcc, html

from gpulens.dashboard import ids
from gpulens.dashboard.components import (
    ViewState,
    banner,
    graph,
    page_header,
    panel,
    register_page,
    register_toolbar,
    table,
    toolbar_inputs,
    view_state,
)
from gpulens.dashboard.context import Context, PageError, guarded
from gpulens.dashboard.figures.style import VALIDATE, base_layout, empty_figure, epoch_ms, figure, palette_color
from gpulens.dashboard.formatting import MISSING, duration_text, percent_text
from gpulens.dashboard.timerange import minute_text, resolve_range
from gpulens.storage.idletrend import step_for
from gpulens.storage.records import IdlePoint, UsageRow
from gpulens.storage.usagereport import GROUPINGS

PATH: Final = "/reports"
IDS: Final = ids.REPORTS
TREND_GROUPS: Final = 6  # the chart draws the groups with the most GPU-hours, and the overall share
OVERALL: Final = "overall"
COLUMNS: Final = ("jobs", "GPU-hours", "used GPU-hours", "idle", "energy kWh", "cost", "hung jobs")


def layout(**query: Any) -> html.Div:
    state = ViewState.from_query(query)
    by = query.get("by") if query.get("by") in GROUPINGS else GROUPINGS[0]
    controls = dcc.RadioItems(
        id=ids.REPORTS_BY,
        className="gl-seg",
        options=[{"label": f"by {g}", "value": g} for g in GROUPINGS],
        value=by,
        inline=True,
    )
    return html.Div(
        [
            page_header("Reports", "who held GPU-hours in the range, and how much of them sat idle", IDS, state),
            html.Div(id=IDS.status),
            panel("GPU usage", html.Div(id=ids.REPORTS_TABLE), controls=controls),
            panel("Idle share of the allocated GPU time", graph(ids.REPORTS_TREND)),
        ]
    )


def register(app: Dash, context: Context) -> None:
    register_page(__name__, path=PATH, title="Reports · gpulens", name="Reports", layout=layout)
    register_toolbar(app, IDS, [(ids.REPORTS_BY, "value", "by")])

    @app.callback(
        Output(IDS.status, "children"),
        Output(ids.REPORTS_TABLE, "children"),
        Output(ids.REPORTS_TREND, "figure"),
        Output(IDS.updated, "children"),
        *toolbar_inputs(IDS),
        Input(ids.REPORTS_BY, "value"),
        State(IDS.refresh, "value"),
    )
    def update(
        range_: str, start: str, end: str, _tick: int | None, by: str, refresh: str
    ) -> tuple[Any, Any, Any, str]:
        state = view_state(range_, start, end, refresh)
        try:
            return render(context, state, by if by in GROUPINGS else GROUPINGS[0])
        except PageError as problem:
            return problem.banner, None, empty_figure("no data"), problem.as_of


def render(context: Context, state: ViewState, by: str) -> tuple[Any, Any, Any, str]:
    now = context.clock.now()

    def load() -> tuple[Any, list[UsageRow], list[IdlePoint], float]:
        span = resolve_range(state.range, state.start, state.end, now, history_start=context.history_start(state.range))
        step = step_for(span.end - span.start)
        rows = context.store.usage(by, span.start, span.end, context.prices)
        trend = context.store.idle_trend(by, span.start, span.end, step, context.prices)
        return span, rows, trend, step

    span, rows, trend, step = guarded(context, load)
    status = None if rows else banner("info", "No jobs in the range.", " No GPU was held by a job in it.")
    shown = [r.group for r in rows[:TREND_GROUPS]]
    return (
        status,
        usage_table(rows, by),
        trend_figure(trend, shown, step),
        f"as of {minute_text(now)} · {span.label}",
    )


def usage_table(rows: Sequence[UsageRow], by: str) -> html.Div:
    """The report's rows, as ``gpulens report`` prints them."""
    cells = [
        [
            r.group,
            str(r.jobs),
            f"{r.gpu_hours:.2f}",
            MISSING if r.used_gpu_hours is None else f"{r.used_gpu_hours:.2f}",
            percent_text(r.idle_ratio),
            MISSING if r.energy_kwh is None else f"{r.energy_kwh:.2f}",
            f"{r.cost:.2f} {r.currency}",
            f"{r.hung_jobs} ({duration_text(r.hung_seconds)})" if r.hung_jobs else "0",
        ]
        for r in rows
    ]
    return table(
        [by, *COLUMNS],
        cells,
        numeric=COLUMNS,
        empty="no job held a GPU in this range",
        table_id=ids.REPORTS_ROWS,
    )


def trend_figure(points: Sequence[IdlePoint], groups: Sequence[str], step_s: float) -> go.Figure:
    """One line per group in ``groups`` and a dashed one for every group together: idle samples among the allocated
    GPUs' samples, per bucket of ``step_s``."""
    if not points:
        return empty_figure("no samples of allocated GPUs in this range")
    counts: dict[str, dict[float, list[int]]] = defaultdict(dict)
    for p in points:
        for name in (p.group, OVERALL) if p.group in groups else (OVERALL,):
            c = counts[name].setdefault(p.start, [0, 0])
            c[0] += p.samples
            c[1] += p.idle_samples
    traces = []
    for i, name in enumerate([OVERALL, *groups]):
        series = sorted(counts.get(name, {}).items())
        if not series:
            continue
        overall = name == OVERALL
        traces.append(
            go.Scatter(
                x=epoch_ms(t + step_s / 2 for t, _ in series),
                y=[round(idle / samples, 4) for _, (samples, idle) in series],
                name=name,
                mode="lines+markers",
                line={"color": "#8a93a3" if overall else palette_color(i - 1), "dash": "dash" if overall else None},
                hovertemplate=f"{name}: %{{y:.0%}} idle<extra></extra>",
                **VALIDATE,
            )
        )
    return figure(
        traces,
        base_layout(
            height=280,
            showlegend=True,
            legend={"orientation": "h", "y": -0.2},
            margin={"l": 56, "r": 16, "t": 12, "b": 56},
            xaxis={"type": "date"},
            yaxis={"range": [0, 1.02], "tickformat": ".0%", "title": {"text": "idle share"}},
        ),
    )
