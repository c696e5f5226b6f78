"""Remediation (``/remediation``): the brake's state, the nodes gpulens holds drained with the incidents or alerts
that hold them, and every decision of the ``[[alerts.actions]]``: what was done, what a dry run would have done, what
was refused and why (``storage.remediationstore``, the audit ``drain_action``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from dash import Dash, Output, State, html

from gpulens.dashboard import ids
from gpulens.dashboard.components import (
    Cell,
    ViewState,
    banner,
    flag,
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
from gpulens.dashboard.formatting import MISSING
from gpulens.dashboard.paths import node_path
from gpulens.dashboard.timerange import minute_text
from gpulens.dashboard.unavailable import Missing, attempt, not_available

PATH: Final = "/remediation"
IDS: Final = ids.REMEDIATION
_TAKEN: Final = ("drained", "resumed", "requeued", "ran", "failed")
DECISIONS: Final = 200


def layout(**query: Any) -> html.Div:
    state = ViewState.from_query(query)
    return html.Div(
        [
            page_header("Remediation", "the brake, the nodes gpulens holds drained, every decision", IDS, state),
            html.Div(id=IDS.status),
            panel("Nodes held by gpulens", html.Div(id=ids.REMEDIATION_HELD)),
            panel("Decisions (done, dry run, refused)", html.Div(id=ids.REMEDIATION_DECISIONS)),
        ]
    )


def register(app: Dash, context: Context) -> None:
    register_page(__name__, path=PATH, title="Remediation · gpulens", name="Remediation", layout=layout)
    register_toolbar(app, IDS)

    @app.callback(
        Output(IDS.status, "children"),
        Output(ids.REMEDIATION_HELD, "children"),
        Output(ids.REMEDIATION_DECISIONS, "children"),
        Output(IDS.updated, "children"),
        *toolbar_inputs(IDS),
        State(IDS.refresh, "value"),
    )
    def update(range_: str, start: str, end: str, _tick: int | None, refresh: str) -> tuple[Any, ...]:
        state = view_state(range_, start, end, refresh)
        try:
            return render(context, state)
        except PageError as problem:
            return problem.banner, None, None, problem.as_of


def render(context: Context, state: ViewState) -> tuple[Any, ...]:
    """(the brake's banner, the held nodes, the decisions, the time line)."""
    now = context.clock.now()

    def load() -> tuple[Any, Any]:
        return attempt(context.store.remediation_state), attempt(lambda: context.store.drain_actions(DECISIONS))

    found, decisions = guarded(context, load)
    as_of = f"as of {minute_text(now)}"
    if isinstance(found, Missing) or isinstance(decisions, Missing):
        return not_available([m for m in (found, decisions) if isinstance(m, Missing)]), None, None, as_of
    halt = found["halt"]
    if halt is None:
        status = banner("info", "Remediation acts.", "The brake has not halted it.")
    else:
        detail = (
            f"Since {minute_text(float(halt['halted_at']))}: {halt['reason']} Lift it with gpulens remediation resume."
        )
        status = banner("bad", "Remediation is halted by its brake.", detail)
    return status, held_table(found["held"], state), decisions_table(decisions, state), as_of


def held_table(held: Sequence[Mapping[str, Any]], state: ViewState) -> html.Div:
    rows: list[list[Cell]] = [
        [
            link(str(h["node"]), node_path(str(h["node"])), state),
            minute_text(float(h["drained_at"])),
            flag("dry run", None) if h["dry_run"] else "drained",
            html.Span(" ".join(str(c["cause"]) for c in h["causes"]) or MISSING, className="mono"),
            str(h["reason"]),
        ]
        for h in held
    ]
    return table(["node", "since", "state", "open causes", "Slurm reason"], rows, empty="no node held by gpulens")


def decisions_table(decisions: Sequence[Mapping[str, Any]], state: ViewState) -> html.Div:
    rows: list[list[Cell]] = [
        [
            minute_text(float(d["time"])),
            str(d["action"]),
            str(d["step"] or "drain"),
            flag(str(d["outcome"]), "firing" if d["outcome"] in _TAKEN else None),
            link(str(d["node"]), node_path(str(d["node"])), state) if d["node"] else MISSING,
            html.Span(str(d["causes"] or d["rule"]), className="mono"),
            str(d["reason"]),
        ]
        for d in decisions
    ]
    columns = ["when", "action", "step", "outcome", "node", "causes", "why"]
    return table(columns, rows, empty="no remediation decision", limit=DECISIONS)
