"""Python's cyclic garbage collector in gpulens's long-running processes: ``tune_garbage_collector`` after start-up,
and ``gc_paused`` while a burst of long-lived objects is built.

A collector round or a dashboard page builds tens of thousands of records (readings of numbers and strings, with no
reference cycles) that live until the next round or page. With Python's default thresholds (700, 10, 10) the
collector walks them, and every object start-up made (modules, Dash's and Plotly's, settings, SQLAlchemy metadata),
several times over: ~0.45 of a 1,000-node collector round's 1.1 CPU-seconds (bench/bench_collector.py: 1.12 -> 0.74
CPU-s once tuned), 30-115 ms of a 1,000-node dashboard page's 0.3-0.6 s (5-20 ms once tuned, PostgreSQL store).
``tune_garbage_collector`` freezes what start-up made (out of every future collection) and collects young objects
every 50,000 allocations: the same memory is freed, by reference counting, far less often walked.

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
GC_THRESHOLDS: Final = (50_000, 20, 20)


def tune_garbage_collector() -> None:
    """Freeze what start-up allocated and collect young objects every 50,000 allocations instead of every 700.

    Call once a process has started (its modules imported, its app built), from its wiring."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


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
