"""The latest round's up GPUs as columns: one list per field, in ``History.up_gpus`` order, built once a round.

At 1,000 nodes a round holds 8,000 GPUs and a dozen per-GPU rules each pass over all of them; almost every GPU
passes no rule's test. A rule first picks the GPUs it could fire on from the columns (a comprehension over a few
lists of plain values, ``GpuColumns.where``), then runs its full test, unchanged, on those few readings only: each
pre-test is a necessary condition of the rule's own test, so the rule fires on exactly the same GPUs. A column is
built when a rule first asks for it (``attrgetter`` mapped over the readings) and shared by every rule of the round.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence, Set
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

    def where_moved_or(self, moved: Set[str], flags: Sequence[str] = (), below_max: Sequence[str] = ()) -> list[Pair]:
        """The pairs an error rule could fire on: the GPUs in ``moved`` (UUIDs whose error counters moved within the
        window: every other GPU's are the same at both ends of any window), those whose field named in ``flags`` is
        set, and those whose field named in ``below_max`` is below its ``_max`` (both known: a narrow PCIe link)."""
        keep = [u in moved for u in self["uuid"]] if moved else [False] * len(self.pairs)
        for name in flags:
            keep = [k or bool(f) for k, f in zip(keep, self[name], strict=True)]
        for name in below_max:
            values = self.zip(name, f"{name}_max")
            keep = [k or (v is not None and m is not None and v < m) for k, (v, m) in zip(keep, values, strict=True)]
        return self.where(keep)
