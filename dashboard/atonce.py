"""A page's independent reads at once where the store answers them so (Prometheus: each read is HTTP queries, and a
page view's snapshot is the reader itself), in turn where it does not (SQL: a page view reads through one session
and transaction, ``dashboard.snapshot``, used by one thread at a time)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import copy_context
from typing import Final, TypeVar

from gpulens.storage.reading import StoreReader

T = TypeVar("T")
CONCURRENT: Final = frozenset({"prometheus"})  # the backends whose reads may run on several threads at once
_POOL: Final = ThreadPoolExecutor(8, thread_name_prefix="gpulens-read")


def start(store: StoreReader, read: Callable[[], T]) -> Callable[[], T]:
    """``read`` begun now on another thread where ``store`` allows it (its result, or its exception, when the
    returned function is called), else run when the returned function is called, in this thread."""
    if store.backend not in CONCURRENT:
        return read
    context = copy_context()  # the pinned reader of this page view (dashboard.snapshot) goes with it
    future: Future[T] = _POOL.submit(context.run, read)
    return future.result
