"""The kubelet read off the collection path: ``BackgroundLister`` asks the kubelet on its own thread and schedule
(``sidereader.SideReader``, reader ``pods``) and answers the pod mapper from the last answer, so a slow or huge kubelet
answer never delays the GPU readings. A kubelet that has not answered yet reads as unavailable; one that stops
answering leaves its last answer in place, marked stale (``gpulens_exporter_reader_stale{reader="pods"}``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Final

from gpulens.exporter.podresources.client import KubeletError
from gpulens.exporter.podresources.mapper import ALLOCATABLE_REFRESH_S, Assignment, Lister
from gpulens.exporter.sidereader import ReaderState, SideReader

READER: Final = "pods"

_Answer = tuple[tuple[Assignment, ...], Mapping[str, tuple[str, ...]] | None]


class BackgroundLister:
    """A ``Lister`` answered from the last answer that its reader fetched from ``lister`` every ``interval_s``."""

    def __init__(
        self,
        lister: Lister,
        *,
        interval_s: float,
        deadline_s: float,
        clock: Callable[[], float] = time.monotonic,
        start: bool = True,
    ) -> None:
        self._lister = lister
        self._clock = clock
        self._allocatable: Mapping[str, tuple[str, ...]] | None = None
        self._allocatable_at: float | None = None
        self.reader: SideReader[_Answer] = SideReader(
            READER, self._fetch, interval_s=interval_s, deadline_s=deadline_s, clock=clock, start=start
        )

    def list(self) -> tuple[Assignment, ...]:
        return self._latest()[0]

    def allocatable(self) -> Mapping[str, tuple[str, ...]] | None:
        return self._latest()[1]

    def state(self) -> ReaderState:
        return self.reader.state()

    def close(self) -> None:
        self.reader.close()

    def _latest(self) -> _Answer:
        latest = self.reader.latest()
        if latest is None:
            raise KubeletError(self.reader.error or "the kubelet has not answered yet")
        return latest

    def _fetch(self) -> _Answer:
        assignments = tuple(self._lister.list())
        now = self._clock()
        if self._allocatable_at is None or now - self._allocatable_at >= ALLOCATABLE_REFRESH_S:
            self._allocatable_at = now
            self._allocatable = self._lister.allocatable()
        return assignments, self._allocatable
