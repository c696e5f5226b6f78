"""NVML's start under a deadline: a driver wedged before the exporter started is a hung driver, not a down exporter.

``NvmlSource`` opens NVML in its constructor (``nvmlInit``, the driver version, every GPU's handle). A wedged driver
never returns from those calls, and an exporter that waited on them would never serve: the node would read as
``ExporterDown``, which mutes every other alert of the node. ``open_nvml`` runs the opening on its own thread and waits
for it up to the deadline. An opening that ends in time gives the source as before (and its errors, such as no
driver, as before). One still running past the deadline gives a ``StartingSource``: it serves the node with no GPU
readings and ``hung_since`` set (``gpulens_node_nvml_hung 1``, ``GpuDriverHung``), so the exporter answers and its
side readers (fabric, host, kernel log) go on. Once the opening returns, the source it gave serves every later read;
if it failed, each read raises its error.

A stuck opening strands exactly one thread (``gpulens-nvml-open``), which a C call cannot be freed from.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Final

from gpulens.clock import Clock, SystemClock
from gpulens.exporter.nvmldeadline import DEFAULT_DEADLINE_S
from gpulens.model import GpuSource, NodeSnapshot, SourceError

log = logging.getLogger(__name__)

SOURCE_NAME: Final = "nvml"


class StartingSource:
    """The GPU source while NVML's opening is stuck in the driver; see the module docstring."""

    def __init__(
        self,
        node: str,
        opening: threading.Thread,
        result: list[GpuSource | BaseException],
        *,
        hung_since: float,
        clock: Clock,
    ) -> None:
        self._node = node
        self._opening = opening
        self._result = result
        self._hung_since = hung_since
        self._clock = clock
        self._announced = False

    def _opened(self) -> GpuSource | None:
        if self._opening.is_alive() or not self._result:
            return None
        outcome = self._result[0]
        if isinstance(outcome, BaseException):
            raise SourceError(f"NVML could not start: {outcome}") from outcome
        if not self._announced:
            self._announced = True
            log.warning("NVML answered at last: the GPUs are read from now on")
        return outcome

    def read(self) -> NodeSnapshot:
        source = self._opened()
        if source is not None:
            return source.read()
        return NodeSnapshot(
            node=self._node, timestamp=self._clock.now(), source=SOURCE_NAME, nvml_hung_since=self._hung_since
        )

    def hung_since(self) -> float | None:
        """Since when NVML's opening has been stuck (Unix seconds); once it returned, the source's own answer."""
        try:
            source = self._opened()
        except SourceError:
            return None
        if source is None:
            return self._hung_since
        hung = getattr(source, "hung_since", None)
        return hung() if callable(hung) else None

    def close(self) -> None:
        if self._opening.is_alive():
            log.warning("NVML is still stuck in its opening; closing without shutting it down")
            return
        if self._result and not isinstance(self._result[0], BaseException):
            self._result[0].close()


def open_nvml(
    node: str,
    opener: Callable[[], GpuSource],
    *,
    deadline_s: float = DEFAULT_DEADLINE_S,
    clock: Clock | None = None,
) -> GpuSource:
    """The opened source, or, when ``opener`` has not returned within ``deadline_s``, a ``StartingSource`` that
    serves the node as hung meanwhile. An opening that fails in time raises its error here."""
    clock = clock or SystemClock()
    result: list[GpuSource | BaseException] = []

    def run() -> None:
        try:
            result.append(opener())
        except BaseException as exc:  # noqa: BLE001 - handed to the reader of the result
            result.append(exc)

    began = clock.now()
    opening = threading.Thread(target=run, name="gpulens-nvml-open", daemon=True)
    opening.start()
    opening.join(deadline_s)
    if not opening.is_alive():
        outcome = result[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome
    log.error(
        "NVML has not opened in %.0fs: the driver is hung; serving the node without GPU readings (GpuDriverHung) "
        "until it answers",
        deadline_s,
    )
    return StartingSource(node, opening, result, hung_since=began + deadline_s, clock=clock)
