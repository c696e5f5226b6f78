"""Leadership, the one election: the collector pair and the rule runner (``gpulens alerts run``, the elected collector
of a sharded set) use it and nothing else elects. On a real PostgreSQL, two members of a pair on one advisory lock,
one active, and the holder's session left ``idle`` between probes, so a server that ends sessions idle in a
transaction does not take the lock away."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import psycopg
import pytest

from gpulens.alerts.storeround import RULES_LOCK_KEY, SharedStoreRules, rules_leadership
from gpulens.collector.pair import pair_key, pair_leadership
from gpulens.rounds import RoundResult
from gpulens.settings import Settings, TargetSettings, default_settings
from gpulens.storage.db import Database
from gpulens.storage.leader import Leadership
from tests.core.test_layers import ROOT, source_files
from tests.storage.conftest import PgServer

IDLE_IN_TRANSACTION_TIMEOUT = "2s"


def collector_settings() -> Settings:
    """A collector's settings (the store is not part of its pair's key)."""
    return dataclasses.replace(
        default_settings(environ={}), targets=(TargetSettings(url="http://127.0.0.1:9/", name="node-00"),)
    )


# Each user of the election: how it builds its Leadership on a store, and the key of its lock.
MEMBERS: dict[str, tuple[Callable[[Database], Leadership], int]] = {
    "collector-pair": (lambda db: pair_leadership(db, collector_settings()), pair_key(collector_settings())),
    "alerts-run": (lambda db: rules_leadership(db, what="this gpulens alerts run"), RULES_LOCK_KEY),
}


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


@pytest.mark.parametrize("member", sorted(MEMBERS))
def test_the_holder_stays_active_where_the_server_ends_sessions_idle_in_a_transaction(
    pg_server: PgServer, strict_database: str, member: str
) -> None:
    url = pg_server.url(strict_database)
    make, key = MEMBERS[member]
    with ExitStack() as stack:
        members = []
        for _ in range(2):
            db = Database(url)
            stack.callback(db.close)
            leadership = make(db)
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
                seen.append((b.check(), a.check(), [state for _, state in lock_sessions(admin, key)]))
            a.release()  # its autocommit session gives the lock up at once
            assert (b.check(), a.check()) == (True, False)
    # b stays on standby and a active, its lock's session idle between probes, not idle in a transaction.
    assert seen == [(False, True, ["idle"])] * 4, seen


def test_the_rule_runner_and_the_collector_pair_elect_with_one_class(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'gpulens.db'}")
    try:
        election = SharedStoreRules(db, lambda: lambda _round: None, max_age_s=30.0)
        election(RoundResult(time=0.0, snapshots=[], targets=[], written=True))
        made = [pair_leadership(db, collector_settings()), rules_leadership(db, what="x"), election.leadership]
        assert [type(m) for m in made] == [Leadership] * 3
        assert [m.active for m in made] == [None, None, True]
    finally:
        db.close()
    # Nothing else elects: the lock is taken in storage/leader.py only, and Leadership is built by the collector
    # pair and the rule runner, which gpulens collector and gpulens alerts run use.
    found: dict[str, set[str]] = {"pg_try_advisory_lock": set(), "AdvisoryLock": set(), r"\bLeadership\(": set()}
    for path in source_files("gpulens", "storage", "collector", "alerts", "dashboard", "exporter"):
        text = path.read_text()
        for pattern, where in found.items():
            if re.search(pattern, text):
                where.add(str(path.relative_to(ROOT)))
    assert found == {
        "pg_try_advisory_lock": {"storage/leader.py"},
        "AdvisoryLock": {"storage/leader.py"},
        r"\bLeadership\(": {"collector/pair.py", "alerts/storeround.py"},
    }
    assert "pair_leadership(" in (ROOT / "collector/loop.py").read_text()
    assert "rules_leadership(" in (ROOT / "gpulens/cli/cmd_alerts.py").read_text()
