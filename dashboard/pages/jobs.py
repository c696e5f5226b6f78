"""Jobs (``/jobs``): which job runs on which GPUs (the node x GPU grid coloured by job), and a table of the jobs seen
in the range with their size, duration, GPU-hours, utilization, balance and flags (stalled, straggling, idle).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from dash import Dash, Input, Output, State, ctx, dcc, html

from gpulens.dashboard import ids
from gpulens.dashboard.components import (
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
from gpulens.dashboard.figures.grids import job_grid
from gpulens.dashboard.figures.style import empty_figure
from gpulens.dashboard.flags import FLAG_ORDER, range_flags
from gpulens.dashboard.formatting import MISSING, bytes_text, duration_text, percent_text
from gpulens.dashboard.grid import grid_cells, named_page, nodes_on_page, parse_page
from gpulens.dashboard.heatmaps import METRIC_FIELDS, METRICS
from gpulens.dashboard.paths import job_path
from gpulens.dashboard.timerange import minute_text, resolve_range
from gpulens.storage.records import JobSummary

PATH: Final = "/jobs"
IDS: Final = ids.JOBS
FLAG_FILTERS: Final = {
    "all": "all jobs",
    "flagged": "flagged",
    "stalled": "stalled",
    "straggling": "straggling",
    "idle": "idle",
}
# The table's rows, flagged jobs first, then by GPU-hours; the flag and text filters find the others. At 1,000 x 8
# the page took 0.97-1.09 s in headless Chromium with 200 rows, 0.72-0.80 s with 100 (bench_dashboard, alternating):
# most of its time is the browser mounting each cell's component.
MAX_ROWS: Final = 100


def layout(**query: Any) -> html.Div:
    state = ViewState.from_query(query)
    flag_filter = query.get("flag") if query.get("flag") in FLAG_FILTERS else "all"
    grid_controls = html.Div(
        className="gl-controls",
        children=[
            html.Button("← previous", id=ids.JOBS_PREV, className="gl-button", title="previous nodes"),
            html.Span(id=ids.JOBS_PAGE_INFO, className="gl-hint"),
            html.Button("next →", id=ids.JOBS_NEXT, className="gl-button", title="next nodes"),
        ],
    )
    table_controls = html.Div(
        className="gl-controls",
        children=[
            dcc.RadioItems(
                id=ids.JOBS_FLAG,
                className="gl-seg",
                options=[{"label": text, "value": key} for key, text in FLAG_FILTERS.items()],
                value=flag_filter,
                inline=True,
            ),
            dcc.Input(
                id=ids.JOBS_FILTER,
                className="gl-input gl-filter",
                placeholder="filter job or user",
                value=str(query.get("q") or "")[:100],
                debounce=True,
                type="text",
            ),
        ],
    )
    return html.Div(
        [
            page_header("Jobs", "task distribution: who runs where, and how well", IDS, state),
            html.Div(id=IDS.status),
            panel("Jobs in the range", html.Div(id=ids.JOBS_TABLE), controls=table_controls),
            panel("GPUs by job (now)", graph(ids.JOBS_GRID), controls=grid_controls),
            dcc.Store(id=ids.JOBS_PAGE, data=parse_page(query.get("page")) + 1),
            dcc.Store(id=ids.JOBS_PAGES, data=1),
        ]
    )


def register(app: Dash, context: Context) -> None:
    register_page(__name__, path=PATH, title="Jobs · gpulens", name="Jobs", layout=layout)
    register_toolbar(
        app, IDS, [(ids.JOBS_FLAG, "value", "flag"), (ids.JOBS_FILTER, "value", "q"), (ids.JOBS_PAGE, "data", "page")]
    )
    register_click_through(app, IDS, ids.JOBS_GRID)

    @app.callback(
        Output(ids.JOBS_PAGE, "data"),
        Input(ids.JOBS_PREV, "n_clicks"),
        Input(ids.JOBS_NEXT, "n_clicks"),
        State(ids.JOBS_PAGE, "data"),
        State(ids.JOBS_PAGES, "data"),
        prevent_initial_call=True,
    )
    def turn_page(_prev: int | None, _next: int | None, page: int, count: int) -> int:
        return max(1, page - 1) if ctx.triggered_id == ids.JOBS_PREV else min(count, page + 1)

    @app.callback(
        Output(IDS.status, "children"),
        Output(ids.JOBS_TABLE, "children"),
        Output(ids.JOBS_GRID, "figure"),
        Output(ids.JOBS_PAGE_INFO, "children"),
        Output(ids.JOBS_PREV, "disabled"),
        Output(ids.JOBS_NEXT, "disabled"),
        Output(ids.JOBS_PAGES, "data"),
        Output(IDS.updated, "children"),
        *toolbar_inputs(IDS),
        Input(ids.JOBS_FLAG, "value"),
        Input(ids.JOBS_FILTER, "value"),
        Input(ids.JOBS_PAGE, "data"),
        State(IDS.refresh, "value"),
    )
    def update(
        range_: str,
        start: str,
        end: str,
        _tick: int | None,
        flag_filter: str,
        text: str | None,
        page: int,
        refresh: str,
    ) -> tuple[Any, ...]:
        state = view_state(range_, start, end, refresh)
        try:
            return render(context, state, flag_filter, text or "", page)
        except PageError as problem:
            blank = empty_figure("no data")
            return problem.banner, None, blank, "", True, True, 1, problem.as_of


def render(context: Context, state: ViewState, flag_filter: str, text: str, page: int) -> tuple[Any, ...]:
    now = context.clock.now()

    def load() -> tuple[Any, ...]:
        span = resolve_range(state.range, state.start, state.end, now, history_start=context.history_start(state.range))
        summaries = context.store.jobs(span.start, span.end)
        jobs = context.store.current_jobs()
        # the grid shows one page of the nodes with jobs: read the readings of their held GPUs only
        shown = set(nodes_on_page((j.node for j in jobs), page - 1))
        uuids = sorted({j.uuid for j in jobs if j.node in shown})
        readings = context.store.latest_readings(uuids=uuids, fields=METRIC_FIELDS["utilization"]) if uuids else []
        if not summaries and not jobs:  # no job anywhere: is there any data at all (the banner below)?
            readings = context.store.latest_readings(fields=METRIC_FIELDS["utilization"])
        alerts = context.alerts.active() if context.alerts is not None else None
        episodes = context.alerts.history(span.start, span.end) if context.alerts is not None else []
        return span, summaries, readings, jobs, alerts, episodes

    span, summaries, readings, jobs, alerts, episodes = guarded(context, load)
    flags = range_flags(alerts or [], episodes)
    cells = grid_cells(readings, jobs, now=now, stale_after_s=context.stale_after_s)
    held = [c for c in cells if c.jobs]
    grid = named_page(held, (j.node for j in jobs), METRICS["utilization"], page=page - 1)
    figure = (
        job_grid(grid.cells, grid.nodes, show_text=len(grid.nodes) <= 40)
        if grid.rows
        else empty_figure("no GPU is held by a job now")
    )
    first = grid.page * grid.per_page + 1
    info = (
        f"nodes {first} to {min(len(grid.rows), first + grid.per_page - 1)} of {len(grid.rows)} with jobs"
        if grid.rows
        else ""
    )
    status = None
    if not summaries and not readings:
        status = banner("info", "No data yet.", " The collector has stored no reading in this database.")
    elif alerts is None:
        status = banner("info", "No alert store connected:", " jobs cannot be flagged as stalled, straggling or idle.")
    return (
        context.with_recording_notice(status),
        jobs_table(summaries, flags, flag_filter, text, state),
        figure,
        info,
        grid.page == 0,
        grid.page >= grid.pages - 1,
        grid.pages,
        f"as of {minute_text(now)} · {span.label}",
    )


def jobs_table(
    summaries: Sequence[JobSummary],
    flags: Mapping[str, Mapping[str, bool]],
    flag_filter: str,
    text: str,
    state: ViewState,
) -> html.Div:
    """Flagged jobs first, then by GPU-hours; at most ``MAX_ROWS`` rows. ``flags``: each job's flags in the range
    shown, and whether each is raised now (a flag that ended in the range reads ``stalled (ended)``)."""
    needle = text.strip().lower()

    def keep(s: JobSummary) -> bool:
        job_flags_ = flags.get(s.job_id, {})
        if needle and needle not in s.job_id.lower() and needle not in (s.user or "").lower():
            return False
        if flag_filter == "flagged":
            return bool(job_flags_)
        return flag_filter not in FLAG_ORDER or flag_filter in job_flags_

    chosen = sorted(
        (s for s in summaries if keep(s)), key=lambda s: (not flags.get(s.job_id), -(s.gpu_hours or 0.0), s.job_id)
    )
    rows: list[list[Cell]] = []
    classes = []
    for s in chosen[:MAX_ROWS]:
        mine = flags.get(s.job_id, {})
        marks = [flag(f) if mine[f] else flag(f"{f} (ended)", "ended") for f in FLAG_ORDER if f in mine]
        rows.append(
            [
                link(s.job_id, job_path(s.job_id), state),
                s.user or MISSING,
                str(len(s.gpus)),
                str(len(s.nodes)),
                minute_text(s.first_seen),
                duration_text(s.last_seen - s.first_seen),
                f"{s.gpu_hours:.1f}",
                percent_text(s.utilization_ratio_mean),
                bytes_text(s.memory_used_bytes_mean),
                balance_text(s.utilization_ratio_mean, s.utilization_ratio_stddev),
                html.Span(marks) if marks else "",
            ]
        )
        classes.append("flagged" if marks else "")
    more = f"{len(chosen)} jobs"
    if len(chosen) > MAX_ROWS:
        more = f"showing {MAX_ROWS} of {len(chosen)}, flagged first, then by GPU-hours: filter by job, user or flag"
    return html.Div(
        [
            html.Div(more, className="gl-hint"),
            table(
                [
                    "job",
                    "user",
                    "GPUs",
                    "nodes",
                    "start",
                    "duration",
                    "GPU-hours",
                    "mean util",
                    "memory",
                    "balance",
                    "flags",
                ],
                rows,
                numeric=["GPUs", "nodes", "GPU-hours", "mean util", "memory", "balance"],
                row_classes=classes,
                empty="no job in this range" if not needle and flag_filter == "all" else "no job matches",
                table_id=ids.JOBS_ROWS,
            ),
        ]
    )


def balance_text(mean: float | None, stddev: float | None) -> str:
    """How evenly a job loads its GPUs: the spread of utilization across them (± percentage points)."""
    if mean is None or stddev is None:
        return MISSING
    return f"±{stddev * 100:.0f} pp"
