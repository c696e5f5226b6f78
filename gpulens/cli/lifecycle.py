"""Process lifecycle: one stop event that SIGINT and SIGTERM set, shared by every long-running command."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


@contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """Yield an event that SIGINT or SIGTERM sets; the previous handlers come back on exit.

    Outside the main thread (tests running a command in a thread) no handler can be installed: the event is still
    yielded, for the caller to set.
    """
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
