"""Component ids: constants, prefixed by the page that owns them, so a typo is a NameError and ids never collide.

Every page has the same toolbar (time range, custom from/to, auto-refresh) under its own prefix: ``Toolbar("jobs")``.
Browser tests select components by these ids, so they are part of the dashboard's contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class Toolbar:
    """The ids of one page's toolbar and of the plumbing every page has."""

    prefix: str

    @property
    def range(self) -> str:
        return f"{self.prefix}-range"

    @property
    def custom(self) -> str:
        """The span holding the custom from/to inputs (shown only for the custom range)."""
        return f"{self.prefix}-custom"

    @property
    def start(self) -> str:
        return f"{self.prefix}-from"

    @property
    def end(self) -> str:
        return f"{self.prefix}-to"

    @property
    def refresh(self) -> str:
        return f"{self.prefix}-refresh"

    @property
    def interval(self) -> str:
        return f"{self.prefix}-interval"

    @property
    def status(self) -> str:
        """The banner that says what is missing or broken (no data yet, a target down, the database down)."""
        return f"{self.prefix}-status"

    @property
    def url_sync(self) -> str:
        """A store the URL-sync clientside callback writes to (its output must go somewhere)."""
        return f"{self.prefix}-url-sync"

    @property
    def nav(self) -> str:
        """A location the page's click-throughs write to (``refresh='callback-nav'``)."""
        return f"{self.prefix}-nav"

    @property
    def updated(self) -> str:
        """The "as of" line: when the page's data was read, and for which range."""
        return f"{self.prefix}-updated"


# --- the shell (navigation bar and theme, outside every page) -------------------------------------------------------

SHELL_THEME_TOGGLE: Final = "shell-theme-toggle"  # the theme lives in local storage (gpulens.js), not in a store
SHELL_NAV: Final = "shell-nav"

# --- overview (/) ---------------------------------------------------------------------------------------------------

OVERVIEW: Final = Toolbar("overview")
OVERVIEW_CARDS: Final = "overview-cards"
OVERVIEW_METRIC: Final = "overview-metric"
OVERVIEW_SORT: Final = "overview-sort"
OVERVIEW_FILTER: Final = "overview-filter"
OVERVIEW_PAGE: Final = "overview-page"  # a store: the 1-based page of nodes shown
OVERVIEW_PAGES: Final = "overview-pages"  # a store: how many pages the filter leaves
OVERVIEW_PAGE_INFO: Final = "overview-page-info"
OVERVIEW_PREV: Final = "overview-prev"
OVERVIEW_NEXT: Final = "overview-next"
OVERVIEW_MAP: Final = "overview-map"
OVERVIEW_MAP_PANEL: Final = "overview-map-panel"  # hidden while every node fits one page
OVERVIEW_HEATMAP: Final = "overview-heatmap"
OVERVIEW_TARGETS: Final = "overview-targets"
OVERVIEW_FABRIC: Final = "overview-fabric"  # the fabric column of the nodes shown

# --- node (/nodes/<node>) and GPU (/gpus/<uuid>) --------------------------------------------------------------------

NODE: Final = Toolbar("node")
NODE_NAME: Final = "node-name"
NODE_INFO: Final = "node-info"
NODE_GPUS: Final = "node-gpus"
NODE_CHART: Final = "node-chart-{}"  # .format(chart key): node-chart-utilization, node-chart-power, ...
NODE_CHARTS: Final = "node-charts"
NODE_PROCESSES: Final = "node-processes"
NODE_ALERTS: Final = "node-alerts"

GPU: Final = Toolbar("gpu")
GPU_UUID: Final = "gpu-uuid"
GPU_TITLE: Final = "gpu-title"
GPU_INFO: Final = "gpu-info"
GPU_CHART: Final = "gpu-chart-{}"
GPU_CHARTS: Final = "gpu-charts"
GPU_PROCESSES: Final = "gpu-processes"
GPU_ALERTS: Final = "gpu-alerts"

# --- jobs (/jobs) and job (/jobs/<job_id>) --------------------------------------------------------------------------

JOBS: Final = Toolbar("jobs")
JOBS_FLAG: Final = "jobs-flag"
JOBS_FILTER: Final = "jobs-filter"
JOBS_PAGE: Final = "jobs-page"
JOBS_PAGES: Final = "jobs-pages"
JOBS_PAGE_INFO: Final = "jobs-page-info"
JOBS_PREV: Final = "jobs-prev"
JOBS_NEXT: Final = "jobs-next"
JOBS_GRID: Final = "jobs-grid"
JOBS_TABLE: Final = "jobs-table"
JOBS_ROWS: Final = "jobs-table-rows"

JOB: Final = Toolbar("job")
JOB_ID: Final = "job-id"
JOB_INFO: Final = "job-info"
JOB_CHARTS: Final = "job-charts"
JOB_UTILIZATION: Final = "job-chart-utilization"
JOB_NVLINK: Final = "job-chart-nvlink"
JOB_POWER: Final = "job-chart-power"
JOB_GPUS: Final = "job-gpus"
JOB_ALERTS: Final = "job-alerts"
JOB_FABRIC: Final = "job-fabric"  # the job's fabric traffic and host CPU, under its GPUs' charts
JOB_FABRIC_CHART: Final = "job-chart-fabric"
JOB_HOST_CPU: Final = "job-chart-host-cpu"

# --- interconnect (/interconnect) -----------------------------------------------------------------------------------

INTERCONNECT: Final = Toolbar("ic")
IC_NODE: Final = "ic-node"
IC_THROUGHPUT: Final = "ic-throughput"
IC_DEGRADED: Final = "ic-degraded"
IC_ERRORS: Final = "ic-errors"
IC_ERROR_CHART: Final = "ic-error-chart"
IC_TOPOLOGY: Final = "ic-topology"
IC_TOPOLOGY_NOTE: Final = "ic-topology-note"  # the chosen node's fabric in words, or why it has none
IC_FABRIC: Final = "ic-fabric"  # the table of every RDMA port

# --- alerts (/alerts) -----------------------------------------------------------------------------------------------

ALERTS: Final = Toolbar("alerts")
ALERTS_ACTIVE: Final = "alerts-active"
ALERTS_HISTORY: Final = "alerts-history"
ALERTS_SILENCES: Final = "alerts-silences"
ALERTS_DRAINS: Final = "alerts-drains"

# --- remediation (/remediation) -------------------------------------------------------------------------------------

REMEDIATION: Final = Toolbar("remediation")
REMEDIATION_HELD: Final = "remediation-held"
REMEDIATION_DECISIONS: Final = "remediation-decisions"

# --- incidents (/incidents, and the incident panels of the overview, node, GPU and job pages) -----------------------

INCIDENTS: Final = Toolbar("incidents")
INCIDENTS_OPEN: Final = "incidents-open"
INCIDENTS_HISTORY: Final = "incidents-history"
OVERVIEW_INCIDENTS: Final = "overview-incidents"
NODE_INCIDENTS: Final = "node-incidents"
GPU_INCIDENTS: Final = "gpu-incidents"
JOB_INCIDENTS: Final = "job-incidents"

# --- reports (/reports) ---------------------------------------------------------------------------------------------

REPORTS: Final = Toolbar("reports")
REPORTS_BY: Final = "reports-by"  # group by user, account or partition
REPORTS_TABLE: Final = "reports-table"
REPORTS_ROWS: Final = "reports-table-rows"
REPORTS_TREND: Final = "reports-idle-trend"  # the idle share over time, per group
