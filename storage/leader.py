"""Electing one process among several that share a PostgreSQL store: ``Leadership``, the one election of gpulens.
It elects the active collector of an HA pair (``collector.pair``), the process that runs the alert rules over a
store (``gpulens alerts run``, or one collector of a sharded set: ``alerts.storeround``), and nothing else elects.

The election is a session advisory lock held on a connection of its own (``pg_try_advisory_lock``). The lock goes
with the connection: a process that dies frees it, at once when it is killed (its socket closes), and when its host
or network goes away once the server's TCP keepalive probes of the lock's session go unanswered (the session asks
for them: 20 s idle, then 3 probes 10 s apart). The connection runs in autocommit, so between rounds its session is
``idle``, never ``idle in transaction``: a server with ``idle_in_transaction_session_timeout`` leaves it alone.

SQLite has no such lock (and one SQLite file is not shared across hosts): there nobody is elected, every process is
active, and the rules of a sharded set of collectors run in ``gpulens alerts run`` instead.
"""

from __future__ import annotations

import logging
from typing import Final

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpulens.storage.db import Database, DatabaseUnavailableError

log = logging.getLogger(__name__)

# The lock's session asks the server to probe its client: a holder whose host or network went away is dropped (and
# its lock freed) once IDLE + INTERVAL * COUNT seconds of probes go unanswered, not after the kernel's two hours.
_KEEPALIVES: Final = "SET tcp_keepalives_idle = 20; SET tcp_keepalives_interval = 10; SET tcp_keepalives_count = 3"

HA_PAIR_ACTIVE: Final = "is now the active one of its HA pair (it holds the advisory lock)"


def on_standby(note: str) -> str:
    """What a member of an HA pair logs on standby (after its name): ``note`` says what a standby does."""
    return f"is on standby: {note}"


class _AdvisoryLock:
    """A PostgreSQL session advisory lock on ``key``, tried each time; held until ``release`` or the process ends.
    ``Leadership`` is its one user."""

    def __init__(self, db: Database, key: int) -> None:
        self._db = db
        self._key = key
        self._conn: Connection | None = None

    @property
    def supported(self) -> bool:
        return self._db.dialect == "postgresql"

    def try_hold(self) -> bool:
        """True while this process holds the lock (taking it if it is free). A held lock whose connection broke
        is lost (the server freed it): it is tried again on a new connection. Raises ``DatabaseUnavailableError``."""
        if not self.supported:
            return False
        with self._db.translate_errors():
            if self._conn is not None:
                try:
                    self._conn.exec_driver_sql("SELECT 1")  # in autocommit: the session stays idle, in no transaction
                    return True
                except sa.exc.DBAPIError:
                    self._drop()
            # Autocommit: no statement of this connection leaves a transaction open (the pool restores the isolation
            # level when the connection goes back to it).
            conn = self._db.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            try:
                conn.exec_driver_sql(_KEEPALIVES)
                held = bool(conn.execute(sa.text("SELECT pg_try_advisory_lock(:key)"), {"key": self._key}).scalar())
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
            except sa.exc.SQLAlchemyError:
                pass
            finally:
                conn.close()


class Leadership:
    """The role of one process in a group of identical ones sharing a PostgreSQL store: **active** while it holds
    the advisory lock ``key``, **standby** otherwise. ``check()`` is called once a round; it logs one line at each
    change of role (the first role at info, a change at warning). On SQLite there is no group: the process is always
    active (logged once).

    Each line is ``what`` followed by ``says_active`` or ``says_standby``: "this collector" + ``HA_PAIR_ACTIVE``."""

    def __init__(
        self, db: Database, key: int, *, what: str, says_standby: str, says_active: str = HA_PAIR_ACTIVE
    ) -> None:
        self._lock = _AdvisoryLock(db, key)
        self._what = what
        self._says_active = says_active
        self._says_standby = says_standby
        self.active: bool | None = None  # None until the first check that reached the database

    @property
    def supported(self) -> bool:
        return self._lock.supported

    def check(self) -> bool | None:
        """True: active; False: standby; None: the database is unreachable, so the role is unknown (``active``
        keeps the last role known)."""
        if not self._lock.supported:
            if self.active is None:
                log.info("%s runs alone: an HA pair needs a PostgreSQL store, not SQLite", self._what)
                self.active = True
            return True
        try:
            held = self._lock.try_hold()
        except DatabaseUnavailableError:
            return None
        if held != self.active:
            level = logging.INFO if self.active is None else logging.WARNING  # the first role is news; a change, more
            log.log(level, "%s %s", self._what, self._says_active if held else self._says_standby)
            self.active = held
        return held

    def release(self) -> None:
        """Give the lock up (the process stops, or stops taking part)."""
        self._lock.release()
