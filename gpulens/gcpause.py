"""Holding off Python's cyclic garbage collector while a burst of long-lived objects is built: ``gc_paused``.

Reading a large cluster builds objects that live on (an answer of 8,000 series is some 30,000 of them; a page's
readings as many again). Each burst sets off collections of the older generations, every one walking all that the
burst has built so far: at 1,000 nodes about a third of a page's data loading. Such reads make no reference cycles,
so the collector is held off while they run (by any number of threads at once) and runs again as soon as the last
one ends; a collector that was disabled before stays so. Blocks that overlap without end (a dashboard busy with many
viewers) never starve it: a block ending more than ``MAX_PAUSE_S`` after the pause began collects once.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

MAX_PAUSE_S: Final = 10.0

_lock = threading.Lock()
_holders = 0
_was_enabled = False
_since = 0.0  # monotonic time the pause began (or last collected)


@contextmanager
def gc_paused() -> Iterator[None]:
    """The collector off for the ``with`` block (nested and concurrent blocks allowed)."""
    global _holders, _was_enabled, _since
    with _lock:
        if _holders == 0:
            _was_enabled = gc.isenabled()
            _since = time.monotonic()
            gc.disable()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _was_enabled:
                gc.enable()
            elif _was_enabled and time.monotonic() - _since > MAX_PAUSE_S:
                _since = time.monotonic()
                gc.collect()
