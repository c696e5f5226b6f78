"""Electing one process among several that share a PostgreSQL store: a session advisory lock held on its own
connection (``pg_try_advisory_lock``). The lock goes with the connection: a process that dies frees it.

SQLite has no such lock (and one SQLite file is not shared across hosts): there nobody is elected, and the rules
of a sharded set of collectors run in ``gpulens alerts run`` instead.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpulens.storage.db import Database


class AdvisoryLock:
    """A PostgreSQL session advisory lock on ``key``, tried each time; held until ``release`` or the process ends."""

    def __init__(self, db: Database, key: int) -> None:
        self._db = db
        self._key = key
        self._conn: Connection | None = None

    @property
    def supported(self) -> bool:
        return self._db.dialect == "postgresql"

    def try_hold(self) -> bool:
        """True while this process holds the lock (taking it if it is free). Raises ``DatabaseUnavailableError``."""
        if not self.supported:
            return False
        with self._db.translate_errors():
            if self._conn is not None:
                try:
                    self._conn.execute(sa.text("SELECT 1"))
                    return True
                except sa.exc.DBAPIError:
                    self._drop()
                    raise
            conn = self._db.engine.connect()
            try:
                held = bool(conn.execute(sa.text("SELECT pg_try_advisory_lock(:key)"), {"key": self._key}).scalar())
                conn.commit()
            except BaseException:
                conn.close()
                raise
            if held:
                self._conn = conn
            else:
                conn.close()
            return held

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.invalidate()
                conn.close()
            except sa.exc.SQLAlchemyError:
                pass

    def release(self) -> None:
        """Give the lock up (closing its connection frees it)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.execute(sa.text("SELECT pg_advisory_unlock(:key)"), {"key": self._key})
                conn.commit()
            except sa.exc.SQLAlchemyError:
                pass
            finally:
                conn.close()
