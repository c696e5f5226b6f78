"""Leadership on a real PostgreSQL: two processes on one advisory lock, one active, and the holder's session left
``idle`` between probes, so a server that ends sessions idle in a transaction does not take the lock away."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack

import psycopg
import pytest

from gpulens.storage.db import Database
from gpulens.storage.leader import Leadership
from tests.storage.conftest import PgServer

KEY = 0x67706C6561646572  # "gpleader"
IDLE_IN_TRANSACTION_TIMEOUT = "2s"


def lock_sessions(admin: psycopg.Connection[tuple[object, ...]], key: int) -> list[tuple[object, ...]]:
    """(pid, state) of each session holding the advisory lock ``key`` (pg_locks shows its two 32-bit halves)."""
    unsigned = key & 0xFFFFFFFFFFFFFFFF
    return admin.execute(
        "SELECT a.pid, a.state FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = "
        "'advisory' AND l.granted AND l.classid::text = %s AND l.objid::text = %s",
        (str(unsigned >> 32), str(unsigned & 0xFFFFFFFF)),
    ).fetchall()


def outlast_idle_in_transaction_timeout(server: PgServer, database: str) -> None:
    """Return once the server has ended a session that went idle in a transaction after this call began: any other
    session idle in a transaction since before then has been ended too."""
    witness = psycopg.connect(host="127.0.0.1", port=server.port, user="postgres", dbname=database)
    try:
        pid = witness.execute("SELECT pg_backend_pid()").fetchone()  # opens a transaction and leaves it idle
        with server.admin() as admin:
            while admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", pid).fetchone() != (0,):
                time.sleep(0.1)
    finally:
        witness.close()


@pytest.fixture
def strict_database(pg_server: PgServer) -> Iterator[str]:
    """A database whose sessions are ended by the server after 2 s idle inside a transaction."""
    name = pg_server.create_database()
    with pg_server.admin() as admin:
        admin.execute(
            f"ALTER DATABASE \"{name}\" SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION_TIMEOUT}'"
        )
    yield name
    pg_server.drop_database(name)


def test_the_holder_stays_active_where_the_server_ends_sessions_idle_in_a_transaction(
    pg_server: PgServer, strict_database: str
) -> None:
    url = pg_server.url(strict_database)
    with ExitStack() as stack:
        members = []
        for name in ("a", "b"):
            db = Database(url)
            stack.callback(db.close)
            leadership = Leadership(db, KEY, what=f"process {name}", standby_note="the other one holds the lock")
            stack.callback(leadership.release)
            members.append(leadership)
        a, b = members
        assert a.check()  # a takes the free lock
        seen = []
        with pg_server.admin() as admin:
            for round_ in range(4):
                if round_:
                    # The server has ended every session idle in a transaction as long as its timeout since the last
                    # round. The standby asks first: it would take a lock the server had freed.
                    outlast_idle_in_transaction_timeout(pg_server, strict_database)
                seen.append((b.check(), a.check(), [state for _, state in lock_sessions(admin, KEY)]))
            a.release()  # its autocommit session gives the lock up at once
            assert (b.check(), a.check()) == (True, False)
    # b stays on standby and a active, its lock's session idle between probes, not idle in a transaction.
    assert seen == [(False, True, ["idle"])] * 4, seen
