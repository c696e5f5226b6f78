"""Node x GPU grids at any cluster size: which nodes a page shows (filter, sort, page), pure and tested directly."""

from __future__ import annotations

import functools
import math
import re
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from gpulens.alerts.state import AlertState
from gpulens.dashboard.figures.grids import GridCell
from gpulens.dashboard.heatmaps import Metric
from gpulens.dashboard.hung import hang_text, hung_gpus
from gpulens.model import GpuJob, GpuReading

NODES_PER_PAGE: Final = 32
SORTS: Final = {"name": "node name", "value": "highest value first", "problems": "problems first"}
DEFAULT_SORT: Final = "name"
_DIGITS: Final = re.compile(r"(\d+)")


@dataclass(frozen=True, slots=True)
class NodeRow:
    """One node's GPUs, and what sorting needs to know about them."""

    node: str
    cells: tuple[GridCell, ...]
    value: float | None  # mean of the metric over the node's up, fresh GPUs
    problems: int  # GPUs down or stale


@dataclass(frozen=True, slots=True)
class GridPage:
    rows: tuple[NodeRow, ...]  # every node that passed the filter, sorted
    page: int  # 0-based, clamped to the pages that exist
    pages: int
    per_page: int

    @property
    def shown(self) -> tuple[NodeRow, ...]:
        return self.rows[self.page * self.per_page : (self.page + 1) * self.per_page]

    @property
    def nodes(self) -> list[str]:
        return [row.node for row in self.shown]

    @property
    def cells(self) -> list[GridCell]:
        return [cell for row in self.shown for cell in row.cells]

    def page_of(self, node: str) -> int | None:
        """The page that shows ``node``, or ``None`` when the filter hides it."""
        for i, row in enumerate(self.rows):
            if row.node == node:
                return i // self.per_page
        return None


def grid_cells(
    readings: Sequence[GpuReading],
    jobs: Sequence[GpuJob],
    *,
    now: float,
    stale_after_s: float,
    alerts: Iterable[AlertState] = (),
) -> list[GridCell]:
    """Each GPU's newest reading with the jobs holding it; stale when older than ``stale_after_s``; hung where
    ``alerts`` say so (``dashboard.hung``)."""
    by_uuid: dict[str, list[GpuJob]] = defaultdict(list)
    for job in jobs:
        by_uuid[job.uuid].append(job)
    held = {r.uuid: tuple(sorted(by_uuid.get(r.uuid, ()), key=lambda j: j.job_id)) for r in readings}
    hung = hung_gpus(alerts, [(r.uuid, r.node, held[r.uuid]) for r in readings])
    return [
        GridCell(
            r,
            held[r.uuid],
            now - r.timestamp > stale_after_s,
            hang_text(hung[r.uuid]) if r.uuid in hung else "",
        )
        for r in readings
    ]


def node_rows(cells: Sequence[GridCell], metric: Metric) -> list[NodeRow]:
    by_node: dict[str, list[GridCell]] = defaultdict(list)
    for cell in cells:
        by_node[cell.reading.node].append(cell)
    rows = []
    for node, node_cells in by_node.items():
        node_cells.sort(key=lambda c: c.reading.gpu)
        values = [v for c in node_cells if c.reading.up and not c.stale if (v := metric.value(c.reading)) is not None]
        problems = sum(1 for c in node_cells if not c.reading.up or c.stale)
        rows.append(NodeRow(node, tuple(node_cells), statistics.fmean(values) if values else None, problems))
    return rows


@functools.lru_cache(maxsize=1 << 16)
def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """``node-2`` before ``node-10``. Cached: a page of 1,000 nodes sorts by it on every refresh."""
    parts = _DIGITS.split(name)  # text, digits, text, digits, ..., text
    return tuple((0, int(part)) if i % 2 else (1, part) for i, part in enumerate(parts) if part)


_SORT_KEYS: Final[Mapping[str, Callable[[NodeRow], tuple[object, ...]]]] = {
    "name": lambda row: (natural_key(row.node),),
    "value": lambda row: (row.value is None, -(row.value or 0.0), natural_key(row.node)),
    "problems": lambda row: (-row.problems, row.value is None, -(row.value or 0.0), natural_key(row.node)),
}


def select_page(
    cells: Sequence[GridCell],
    metric: Metric,
    *,
    text: str = "",
    sort: str = DEFAULT_SORT,
    page: int = 0,
    per_page: int = NODES_PER_PAGE,
) -> GridPage:
    """The nodes whose name contains ``text`` (case-insensitive), sorted, and the ``page``-th slice of them."""
    needle = text.strip().lower()
    rows = [row for row in node_rows(cells, metric) if needle in row.node.lower()]
    rows.sort(key=_SORT_KEYS.get(sort, _SORT_KEYS[DEFAULT_SORT]))
    pages = max(1, math.ceil(len(rows) / per_page))
    return GridPage(tuple(rows), max(0, min(page, pages - 1)), pages, per_page)


def nodes_on_page(nodes: Iterable[str], page: int, per_page: int = NODES_PER_PAGE) -> list[str]:
    """The nodes of the ``page``-th slice (0-based, clamped) of ``nodes`` in name order: what ``named_page`` shows,
    known before any reading is read, so that a page reads the readings of those nodes only."""
    ordered = sorted(set(nodes), key=natural_key)
    pages = max(1, math.ceil(len(ordered) / per_page))
    first = max(0, min(page, pages - 1)) * per_page
    return ordered[first : first + per_page]


def named_page(
    cells: Sequence[GridCell], nodes: Iterable[str], metric: Metric, *, page: int = 0, per_page: int = NODES_PER_PAGE
) -> GridPage:
    """Every node of ``nodes`` in name order, and the ``page``-th slice of them; ``cells`` need hold only the cells
    of that slice's nodes (``nodes_on_page``): a node without cells is a row without cells."""
    filled = {row.node: row for row in node_rows(cells, metric)}
    rows = tuple(filled.get(node, NodeRow(node, (), None, 0)) for node in sorted(set(nodes), key=natural_key))
    pages = max(1, math.ceil(len(rows) / per_page))
    return GridPage(rows, max(0, min(page, pages - 1)), pages, per_page)


def parse_page(value: object) -> int:
    """A 1-based page number from the URL or an input, as a 0-based index (bad input: the first page)."""
    try:
        return max(0, int(str(value)) - 1)
    except ValueError:
        return 0
