"""Storage fixtures: every storage test runs on an SQLite file and on a real PostgreSQL server.

The PostgreSQL server is a throwaway cluster (initdb + pg_ctl on a free port, as the postgres user when running as
root), started once per session. Missing PostgreSQL binaries fail the PostgreSQL tests loudly: they are never skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from gpulens.clock import ManualClock
from gpulens.storage.db import Database
from tests.conftest import free_port
from tests.dbtemplate import migrate_once, migrated_sqlite

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z
SECRET_ROLE = "gpulens_secret"
SECRET_PASSWORD = "Tr0ub4dor-and-3-horses"


def _pg_bindir() -> Path:
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parent.parent.name))
    if not candidates:
        pytest.fail(
            "PostgreSQL server binaries not found under /usr/lib/postgresql: install Debian's postgresql package "
            "(.ci/run does) to run the storage tests"
        )
    return candidates[-1].parent


class PgServer:
    """A throwaway PostgreSQL cluster in its own directory, listening on 127.0.0.1:port and a private socket."""

    def __init__(self, root: Path, port: int) -> None:
        self.root = root
        self.port = port
        self.data = root / "data"
        self.bindir = _pg_bindir()
        self._template: str | None = None

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self.bindir / tool), *args]
        if os.geteuid() == 0:  # initdb refuses to run as root
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        if result.returncode != 0:
            pytest.fail(f"{tool} failed ({result.returncode}): {result.stderr.strip() or result.stdout.strip()}")

    def init(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "--auth=trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
        # One role must give a password over TCP: the redaction tests use it.
        (self.data / "pg_hba.conf").write_text(
            f"local all all trust\nhost all {SECRET_ROLE} 127.0.0.1/32 scram-sha-256\nhost all all 127.0.0.1/32 trust\n"
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.root / "log"), "-w", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def admin(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", autocommit=True)

    def create_database(self, *, migrated: bool = False) -> str:
        """A new database owned by the password role: empty, or a copy of one at the newest schema revision."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        template = f' TEMPLATE "{self._migrated_template()}"' if migrated else ""
        with self.admin() as conn:
            conn.execute(f'CREATE DATABASE "{name}"{template}')
            conn.execute(f'GRANT ALL ON DATABASE "{name}" TO {SECRET_ROLE}')
            conn.execute(f'ALTER DATABASE "{name}" OWNER TO {SECRET_ROLE}')
        return name

    def _migrated_template(self) -> str:
        """A database migrated once (tests/dbtemplate.py), that ``create_database(migrated=True)`` copies."""
        if self._template is None:
            name = f"template_{uuid.uuid4().hex[:8]}"
            with self.admin() as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
                conn.execute(f'ALTER DATABASE "{name}" OWNER TO {SECRET_ROLE}')
            migrate_once(self.url(name))
            self._template = name
        return self._template

    def drop_database(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def url(self, database: str, *, user: str = "postgres", password: str | None = None) -> str:
        auth = f"{user}:{password}" if password is not None else user
        return f"postgresql+psycopg://{auth}@127.0.0.1:{self.port}/{database}"


@pytest.fixture(scope="session")
def _pg_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="gpulens-pg-"))  # not under pytest's 0700 tmp dir: postgres must enter it
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _started(root: Path) -> PgServer:
    server = PgServer(root, free_port())
    server.init()
    server.start()
    with server.admin() as conn:
        conn.execute(f"CREATE ROLE {SECRET_ROLE} LOGIN PASSWORD '{SECRET_PASSWORD}'")
    return server


@pytest.fixture(scope="session")
def pg_server(_pg_root: Path) -> Iterator[PgServer]:
    root = _pg_root / "shared"
    root.mkdir()
    server = _started(root)
    yield server
    server.stop()


@pytest.fixture
def private_pg_server(_pg_root: Path) -> Iterator[PgServer]:
    """A server of the test's own, for tests that stop and start it."""
    root = _pg_root / uuid.uuid4().hex[:8]
    root.mkdir()
    server = _started(root)
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A new store on each backend at the newest schema revision, or empty for tests marked ``empty_store`` (the
    migration tests, which upgrade revision by revision)."""
    migrated = request.node.get_closest_marker("empty_store") is None
    if request.param == "sqlite":
        path = tmp_path / "gpulens.db"
        yield migrated_sqlite(path) if migrated else f"sqlite:///{path}"
        return
    server: PgServer = request.getfixturevalue("pg_server")
    name = server.create_database(migrated=migrated)
    yield server.url(name)
    server.drop_database(name)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def db(request: pytest.FixtureRequest, db_url: str, clock: ManualClock) -> Iterator[Database]:
    """A store at the newest schema revision (``db_url`` made it a copy of one migrated once)."""
    database = Database(db_url, clock=clock)
    if request.node.get_closest_marker("empty_store") is not None:
        database.upgrade()
    yield database
    database.close()
