"""The latest round's up GPUs as columns: one list per field, in ``History.up_gpus`` order, built once a round.

At 1,000 nodes a round holds 8,000 GPUs and a dozen per-GPU rules each pass over all of them; almost every GPU
passes no rule's test. A rule first picks the GPUs it could fire on from the columns (a comprehension over a few
lists of plain values, ``GpuColumns.where``), then runs its full test, unchanged, on those few readings only: each
pre-test is a necessary condition of the rule's own test, so the rule fires on exactly the same GPUs. A column is
built when a rule first asks for it (``attrgetter`` mapped over the readings) and shared by every rule of the round.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import compress
from operator import attrgetter
from typing import Any

from gpulens.model import GpuJob, GpuReading

Pair = tuple[GpuReading, Sequence[GpuJob]]


class GpuColumns:
    """The round's up GPUs with the jobs holding each (``pairs``) and, on demand, any reading field as a column."""

    __slots__ = ("_columns", "built", "jobs", "pairs", "readings")

    def __init__(self, pairs: Sequence[Pair]) -> None:
        self.pairs = pairs
        self.readings = [pair[0] for pair in pairs]
        self.jobs = [pair[1] for pair in pairs]
        self._columns: dict[str, list[Any]] = {}
        self.built = 0  # columns built this round (what a test bounds)

    def __getitem__(self, name: str) -> list[Any]:
        """Every up GPU's ``name`` field, in ``pairs`` order."""
        column = self._columns.get(name)
        if column is None:
            column = self._columns[name] = list(map(attrgetter(name), self.readings))
            self.built += 1
        return column

    def zip(self, *names: str) -> Iterable[tuple[Any, ...]]:
        """The columns ``names`` side by side, one tuple per GPU; ``"jobs"``: the jobs holding each GPU."""
        return zip(*(self.jobs if name == "jobs" else self[name] for name in names), strict=True)

    def where(self, keep: Iterable[object]) -> list[Pair]:
        """The pairs whose ``keep`` (one truth value per pair, in order) is true."""
        return list(compress(self.pairs, keep))
