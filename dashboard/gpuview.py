"""The GPU view the node and GPU pages share: their callback, loading a set of GPUs' newest readings, jobs, processes,
series and alerts over the chosen range, and drawing the series as chart panels.

The two pages differ only in which GPUs they show and what they say about them; this module is the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dash import Dash, Output, State, html

from gpulens.alerts.state import AlertState
from gpulens.dashboard.components import ViewState, graph_panel, toolbar_inputs, view_state
from gpulens.dashboard.context import Context, PageError, guarded
from gpulens.dashboard.figures.periods import Period
from gpulens.dashboard.flags import alert_jobs, job_periods
from gpulens.dashboard.ids import Toolbar
from gpulens.dashboard.panels import FIELDS, GpuSeries, gpu_charts
from gpulens.dashboard.timerange import TimeRange, minute_text, resolve_range
from gpulens.model import GpuJob, GpuReading, ProcessReading
from gpulens.storage.reading import NotAvailableOnBackend
from gpulens.storage.records import SeriesData

Render = Callable[[Context, ViewState, str], tuple[Any, ...]]


def register_gpu_view(
    app: Dash, context: Context, ids: Toolbar, outputs: Sequence[str], key: str, render: Render, blank: tuple[Any, ...]
) -> None:
    """The page's one callback: the toolbar and the hidden ``key`` element (node name, GPU UUID) in; the status
    banner, the ``outputs``' children and the "as of" line out. When loading fails the banner says why and the
    outputs show ``blank``.
    """

    @app.callback(
        Output(ids.status, "children"),
        *(Output(output, "children") for output in outputs),
        Output(ids.updated, "children"),
        *toolbar_inputs(ids),
        State(key, "children"),
        State(ids.refresh, "value"),
    )
    def update(range_: str, start: str, end: str, _tick: int | None, value: str, refresh: str) -> tuple[Any, ...]:
        state = view_state(range_, start, end, refresh)
        try:
            return render(context, state, value)
        except PageError as problem:
            return (problem.banner, *blank, problem.as_of)


@dataclass(frozen=True, slots=True)
class GpuView:
    """What the database holds about some GPUs now and over the chosen range."""

    now: float
    span: TimeRange
    readings: list[GpuReading]  # the newest reading of each GPU shown
    jobs: list[GpuJob]  # every job allocation now (the pages pick their GPUs')
    processes: list[ProcessReading] | None  # None: the store keeps no process table
    series: Mapping[str, SeriesData]  # by UUID
    active: Sequence[AlertState] | None  # None: no alert store connected
    history: Sequence[AlertState] = ()  # every alert episode in the range

    def related(self, about: Callable[[AlertState], bool], job_ids: Collection[str]) -> list[AlertState] | None:
        """The alerts about these GPUs (``about``) or about a job on them, pending or firing now first, then those
        that fired in the range, latest first; None where no alert store is connected."""
        if self.active is None:
            return None

        def mine(a: AlertState) -> bool:
            return about(a) or any(j in job_ids for j in alert_jobs(a.labels))

        now = [a for a in self.active if mine(a)]
        seen = {(a.fingerprint, a.active_since) for a in now}
        fired = sorted(
            (e for e in self.history if e.fired_at is not None and mine(e)), key=lambda e: -(e.fired_at or 0)
        )
        return now + [e for e in fired if (e.fingerprint, e.active_since) not in seen]

    def periods(self, job_ids: Collection[str]) -> list[Period]:
        """The stall, straggler and idle periods of the jobs on these GPUs, to shade on their charts."""
        return [p for job in sorted(job_ids) for p in job_periods(self.history, job, now=self.now)]

    @property
    def updated(self) -> str:
        return f"as of {minute_text(self.now)} · {self.span.label}"


def load_gpu_view(
    context: Context,
    state: ViewState,
    shown: Callable[[GpuReading], bool],
    max_points: int,
    *,
    node: str | None = None,
    uuids: Sequence[str] | None = None,
) -> GpuView:
    """The GPUs ``shown`` selects (read only those of ``node`` / ``uuids``, when given), in one guarded step (a
    failure raises ``PageError``)."""
    now = context.clock.now()

    def load() -> GpuView:
        span = resolve_range(state.range, state.start, state.end, now, history_start=context.history_start(state.range))
        store = context.store
        readings = [r for r in store.latest_readings(node=node, uuids=uuids) if shown(r)]
        # the jobs and processes of the node shown (a GPU page's node is its reading's): not the whole cluster's
        scope = node if node is not None else (readings[0].node if uuids and readings else None)
        jobs = store.current_jobs(node=scope)
        processes: list[ProcessReading] | None
        try:
            processes = store.current_processes(node=scope)
        except NotAvailableOnBackend:
            processes = None
        shown_uuids = [r.uuid for r in readings]
        series = store.series(shown_uuids, FIELDS, span.start, span.end, max_points) if shown_uuids else {}
        active = context.alerts.active() if context.alerts is not None else None
        history = context.alerts.history(span.start, span.end) if context.alerts is not None else ()
        return GpuView(now, span, readings, jobs, processes, series, active, history)

    return guarded(context, load)


def chart_panels(
    view: GpuView, gpus: Sequence[GpuSeries], chart_id: str, *, legend: bool = True, periods: Sequence[Period] = ()
) -> list[html.Div]:
    """Every metric chart of ``gpus`` over the view's range (``periods`` shaded), each in a panel with id
    ``chart_id.format(key)``."""
    return [
        graph_panel(chart_id.format(c.key), c.title, c.figure)
        for c in gpu_charts(gpus, start=view.span.start, end=view.span.end, legend=legend, periods=periods)
    ]
