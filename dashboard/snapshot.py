"""One consistent snapshot per page view: every read of one callback goes through one session and transaction.

The storage reads each open ``Database.session()``; a page that makes six of them would see six moments of a store
the collector writes to every 10 s. ``pinned(store)`` hands out a reader whose database returns *one* session, opened
when the block starts and closed when it ends: SQLite reads one WAL snapshot (a deferred ``BEGIN``), PostgreSQL one
``REPEATABLE READ`` transaction. The reader also remembers, for the block, the current jobs and the processes, each
read when first asked for (the cluster-wide pages ask only for the jobs), so that each is read once. Readers other
than the SQL one (Prometheus) are handed back as they are.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, cast

from gpulens.model import GpuJob, ProcessReading
from gpulens.storage import latest
from gpulens.storage.db import Database
from gpulens.storage.reading import SqlReader, StoreReader

_PINNED: ContextVar[StoreReader | None] = ContextVar("gpulens_pinned_reader", default=None)


class _OneSession:
    """A ``Database`` stand-in whose ``session()`` is always the same open session (everything else delegates).

    The session is typed ``Any``: only storage/ names SQLAlchemy."""

    def __init__(self, db: Database, session: Any) -> None:
        self._db = db
        self._session = session

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    @contextmanager
    def session(self) -> Iterator[Any]:
        yield self._session


class SnapshotReader(SqlReader):
    """``SqlReader`` over one open session; the current jobs and the processes are each read once, when asked for."""

    def __init__(self, db: Database, session: Any) -> None:
        super().__init__(cast("Database", _OneSession(db, session)))
        self._jobs: dict[str | None, list[GpuJob]] = {}
        self._processes: dict[str | None, list[ProcessReading]] = {}

    def current_jobs(self, *, node: str | None = None) -> list[GpuJob]:
        jobs = self._jobs.get(node)
        if jobs is None:
            jobs = self._jobs[node] = latest.current_jobs(self.db, node=node)
        return list(jobs)

    def current_processes(self, *, node: str | None = None) -> list[ProcessReading]:
        processes = self._processes.get(node)
        if processes is None:
            processes = self._processes[node] = latest.current_processes(self.db, node=node)
        return list(processes)

    def close(self) -> None:
        """The session belongs to ``pinned``; closing a snapshot reader closes nothing."""


def current() -> StoreReader | None:
    """The reader pinned for this thread's page view, if one is."""
    return _PINNED.get()


@contextmanager
def pinned(store: StoreReader) -> Iterator[StoreReader]:
    """``store`` read through one session for the block (nested blocks reuse the outer one)."""
    outer = _PINNED.get()
    if outer is not None:
        yield outer
        return
    if not isinstance(store, SqlReader) or isinstance(store, SnapshotReader):
        yield store
        return
    db = store.db
    with db.session() as session:
        if db.dialect == "postgresql":  # one snapshot for every statement, not one per statement
            session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        reader = SnapshotReader(db, session)
        token = _PINNED.set(reader)
        try:
            yield reader
        finally:
            _PINNED.reset(token)
