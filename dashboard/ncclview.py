"""The job page's NCCL panel: the ranks NCCL RAS found unreachable, or that the job's stall accuses of holding the
others back (never a rank merely one operation behind for a moment), on the node and GPU where they run.

Read from the store's NCCL rounds (``StoreReader.stuck_ranks``: the SQL store's ``gpulens.storage.ncclstore``; a store
without them raises ``NotAvailableOnBackend``, which the job page says in its line of missing reads). For each
stuck rank the panel shows where it runs (node, GPU, pid), its state, the count it reached against its communicator's
highest count in the collective that differs, and since when it has stood still there: each rank's progress as NCCL
counts it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from dash import html

from gpulens.alerts.names import COMMUNICATION_STALL
from gpulens.alerts.ncclchecks import named_ranks
from gpulens.alerts.state import AlertState
from gpulens.dashboard.components import Cell, ViewState, link, panel, table
from gpulens.dashboard.formatting import gpu_label
from gpulens.dashboard.paths import gpu_path, node_path
from gpulens.dashboard.timerange import minute_text
from gpulens.dashboard.unavailable import Missing, attempt
from gpulens.storage.reading import StoreReader
from gpulens.storage.records import StuckRank


def read_nccl(store: StoreReader, job_id: str, start: float, end: float) -> list[StuckRank] | Missing:
    """The job's stuck ranks in [start, end], or what says that the store keeps no NCCL rounds."""
    return attempt(lambda: store.stuck_ranks(job_id, start, end))


def accused_ranks(alerts: Iterable[AlertState], job_id: str) -> set[tuple[str, int]]:
    """The (node, rank) pairs the job's ``CommunicationStall`` alerts name in their ``stuck_ranks``: the ranks a RAS
    signature (``rank_dead``, ``rank_missing``) accuses."""
    named: set[tuple[str, int]] = set()
    for a in alerts:
        if a.rule == COMMUNICATION_STALL and job_id in a.labels.get("job_id", "").split(","):
            named |= named_ranks(a.annotations.get("stuck_ranks", ""))
    return named


def nccl_panel(
    found: Sequence[StuckRank] | Missing, state: ViewState | None = None, accused: Collection[tuple[str, int]] = ()
) -> html.Div | None:
    """The ranks a RAS signature names in the latest round that had any, each with since when its count stood still:
    a rank RAS holds dead or unresponsive, or one the job's stall names (``accused``). A rank one or two operations
    behind that no signature names is a transient lag, not a culprit: left out. None where no rank is named, or
    where the store keeps no NCCL rounds (the page says so with its other missing reads)."""
    if isinstance(found, Missing):
        return None
    found = [s for s in found if s.state != "ok" or (s.node, s.rank) in accused]
    if not found:
        return None
    newest = max(s.ts for s in found)
    since: dict[tuple[str, int], float] = {}
    last: dict[tuple[str, int], int | None] = {}
    for s in found:  # oldest first: a rank's stand-still starts where its count last changed
        key = (s.comm, s.rank)
        if key not in since or last.get(key) != s.count:
            since[key] = s.ts
        last[key] = s.count
    rows: list[list[Cell]] = []
    for s in sorted((s for s in found if s.ts == newest), key=lambda x: (x.comm, x.rank)):
        where = gpu_label(s.node, s.gpu) if s.gpu is not None else s.node
        gpu_cell: Cell = link(where, gpu_path(s.gpu_uuid), state) if s.gpu_uuid else where
        progress = f"{s.count} of {s.top_count}" if s.count is not None and s.top_count is not None else "-"
        rows.append(
            [
                str(s.rank),
                s.comm,
                link(s.node, node_path(s.node), state),
                gpu_cell,
                str(s.pid) if s.pid is not None else "-",
                s.state if s.state != "ok" else f"{s.lag} behind",
                f"{progress} {s.collective or ''}".strip(),
                minute_text(since[(s.comm, s.rank)]),
            ]
        )
    columns = ["rank", "communicator", "node", "GPU", "pid", "state", "launched", "since"]
    title = f"NCCL: stuck ranks (as of {minute_text(newest)})"
    return panel(title, table(columns, rows, numeric=["rank"]))
