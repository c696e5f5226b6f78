"""One consistent snapshot per page view: every read of one callback goes through one session and transaction.

The storage reads each open ``Database.session()``; a page that makes six of them would see six moments of a store
the collector writes to every 10 s. ``pinned(store)`` reads through ``store.snapshot()`` for the block: over the SQL
store a reader whose database returns *one* session, opened when the block starts and closed when it ends, which also
remembers the current jobs and the processes for the block (``storage.sqlreader.SnapshotReader``); a store without
such moments (Prometheus) gives itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from gpulens.storage.reading import StoreReader

_PINNED: ContextVar[StoreReader | None] = ContextVar("gpulens_pinned_reader", default=None)


def current() -> StoreReader | None:
    """The reader pinned for this thread's page view, if one is."""
    return _PINNED.get()


@contextmanager
def pinned(store: StoreReader) -> Iterator[StoreReader]:
    """``store`` read through one snapshot for the block (nested blocks reuse the outer one)."""
    outer = _PINNED.get()
    if outer is not None:
        yield outer
        return
    with store.snapshot() as reader:
        token = _PINNED.set(reader)
        try:
            yield reader
        finally:
            _PINNED.reset(token)
