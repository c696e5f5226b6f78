"""The dashboard's pages, one module each; ``create_app`` registers them in this order (the navigation's order)."""

from __future__ import annotations

from typing import Final, Protocol

from dash import Dash

from gpulens.dashboard.context import Context
from gpulens.dashboard.pages import (
    alerts,
    gpu,
    incidents,
    interconnect,
    job,
    jobs,
    node,
    overview,
    remediation,
    reports,
)


class Page(Protocol):
    def register(self, app: Dash, context: Context) -> None: ...


PAGES: Final[tuple[Page, ...]] = (incidents, overview, jobs, job, node, gpu, interconnect, alerts, reports, remediation)
