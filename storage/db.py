"""The database handle: engine and sessions, migrations, error translation (URLs are redacted by
``gpulens.httpfetch.redact_url``)."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import event, exc
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from gpulens.clock import Clock, SystemClock
from gpulens.httpfetch import redact_url as redact_url  # re-exported: storage.redact_url
from gpulens.storage import partitions
from gpulens.storage.reading import DatabaseUnavailableError as DatabaseUnavailableError  # re-exported

log = logging.getLogger(__name__)

MIGRATIONS_DIR: Final = Path(__file__).parent / "migrations"
SQLITE_BUSY_TIMEOUT_S: Final = 15.0
PG_CONNECT_TIMEOUT_S: Final = 10
URL_FORMS: Final = (
    "sqlite:///PATH or postgresql+psycopg://USER@HOST/DB; commands that only read also take prometheus+http://HOST:PORT"
)
_SQLITE_UNAVAILABLE: Final = ("locked", "busy", "unable to open", "disk i/o", "readonly", "full")
_LOCK_KEYS: Final = {"1m": 0x6770756C656E7301, "1h": 0x6770756C656E7302}  # "gpulens" + tier number


# Refusals that waiting will not cure: wrong password (28P01), no such role or no pg_hba entry (28000), no such
# database (3D000). psycopg reports connection failures without a SQLSTATE, so the server's message decides then.
_ACCESS_SQLSTATES: Final = frozenset({"28P01", "28000", "3D000"})
_ACCESS_MESSAGES: Final = re.compile(
    r'password authentication failed|authentication failed for user|no pg_hba\.conf entry|role "[^"]*" does not exist'
    r'|database "[^"]*" does not exist|password is required|no password supplied'
)


class SchemaNotReadyError(DatabaseUnavailableError):
    """The database answers but its schema is not there yet (a table is missing: it came back before the collector
    migrated it). Waiting cures it, as for an unreachable database."""


# PostgreSQL's undefined_table; SQLite says "no such table".
_UNDEFINED_TABLE_SQLSTATE: Final = "42P01"


class DatabaseURLError(ValueError):
    """A database URL gpulens cannot use. ``url`` is safe to show (no password); ``reason`` says what would work."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"database URL {url!r}: {reason}")


class DatabaseAccessError(DatabaseUnavailableError):
    """The database refused us (wrong password, unknown role, no such database): waiting will not cure it, so it is
    fatal at start-up. Once running, it is one more way of being unavailable (rounds are spooled)."""


def _normalise(url: str) -> URL:
    try:
        parsed = sa.make_url(url)
    except (exc.ArgumentError, ValueError):
        raise DatabaseURLError(_unparsed_shown(url), f"invalid database URL (expected {URL_FORMS})") from None
    if parsed.host and "@" in parsed.host:  # user:p@ss@host: the password's "@" must be written %40
        raise DatabaseURLError(
            _unparsed_shown(url), f"write an '@' in the user or password as %40 (expected {URL_FORMS})"
        )
    backend = parsed.get_backend_name()
    if backend == "postgres" or parsed.drivername == "postgresql":
        return parsed.set(drivername="postgresql+psycopg")
    if backend not in ("sqlite", "postgresql"):
        reason = f"unsupported database URL scheme {parsed.drivername!r} (expected {URL_FORMS})"
        raise DatabaseURLError(redact_url(url), reason)
    if backend == "postgresql" and parsed.get_driver_name() != "psycopg":
        reason = (
            f"unsupported PostgreSQL driver {parsed.get_driver_name()!r} (expected postgresql+psycopg://USER@HOST/DB)"
        )
        raise DatabaseURLError(redact_url(url), reason)
    return parsed


def _unparsed_shown(url: str) -> str:
    """A URL that does not parse, safe to echo: whatever precedes its last ``@`` (a password, perhaps) hidden."""
    head, at, tail = url.rpartition("@")
    scheme, sep, _ = head.partition("://")
    shown = (f"{scheme}{sep}***@{tail}" if sep else f"***@{tail}") if at else url
    return redact_url(shown) if "?" in shown else shown


class Database:
    """One SQLite file or PostgreSQL database: one engine and one sessionmaker per instance.

    Sessions are for one thread at a time; the caller owns each session it opens.
    """

    def __init__(self, url: str = "sqlite:///gpulens.db", *, clock: Clock | None = None) -> None:
        parsed = _normalise(url)
        self.url_redacted: str = redact_url(url)
        self.dialect: str = parsed.get_backend_name()
        self.clock: Clock = clock or SystemClock()
        self._password = parsed.password if isinstance(parsed.password, str) and parsed.password else None
        self.engine: Engine = self._create_engine(parsed)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._partitions: dict[str, set[int]] = {}
        # An in-memory SQLite database is one connection shared by every thread (StaticPool): its transactions must
        # not interleave (the collector's writer and the notification worker both write). Files and PostgreSQL give
        # each thread its own pooled connection; SQLite files then queue writers with BEGIN IMMEDIATE.
        shared = self.dialect == "sqlite" and parsed.database in (None, "", ":memory:")
        self._serial: threading.RLock | None = threading.RLock() if shared else None

    def _create_engine(self, url: URL) -> Engine:
        if self.dialect == "postgresql":
            return sa.create_engine(
                url, pool_pre_ping=True, connect_args={"connect_timeout": PG_CONNECT_TIMEOUT_S}, hide_parameters=True
            )
        memory = url.database in (None, "", ":memory:")
        connect_args: dict[str, Any] = {"check_same_thread": False}
        if "timeout" not in url.query:  # sqlite:///FILE?timeout=SECONDS overrides the busy timeout
            connect_args["timeout"] = SQLITE_BUSY_TIMEOUT_S
        engine = sa.create_engine(
            url, connect_args=connect_args, poolclass=StaticPool if memory else None, hide_parameters=True
        )
        event.listen(engine, "connect", _sqlite_on_connect)
        event.listen(engine, "begin", _sqlite_on_begin)
        return engine

    # --- transactions -------------------------------------------------------------------------------------------

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session inside a transaction: committed when the block ends, rolled back if it raises.

        Connection failures raise ``DatabaseUnavailableError``.
        """
        with self._serialised(), self.translate_errors(), self._sessions() as session, session.begin():
            yield session

    @contextmanager
    def write_transaction(self) -> Iterator[Connection]:
        """A connection in a write transaction (SQLite: BEGIN IMMEDIATE, so writers queue instead of failing)."""
        with (
            self._serialised(),
            self.translate_errors(),
            self.engine.connect().execution_options(gpulens_write=True) as conn,
            conn.begin(),
        ):
            yield conn

    @contextmanager
    def _serialised(self) -> Iterator[None]:
        if self._serial is None:
            yield
            return
        with self._serial:
            yield

    @contextmanager
    def translate_errors(self) -> Iterator[None]:
        """Turn connection-level failures into ``DatabaseUnavailableError`` with a message free of the password."""
        try:
            yield
        except (exc.OperationalError, exc.InterfaceError, exc.TimeoutError, exc.ProgrammingError) as err:
            if self._is_schema_missing(err):
                raise SchemaNotReadyError(self._message(err, "has no schema yet")) from None
            if isinstance(err, exc.ProgrammingError):
                raise
            if self._is_access_refused(err):
                raise DatabaseAccessError(self._message(err, "refused access")) from None
            if self._is_unavailable(err):
                raise DatabaseUnavailableError(self._message(err)) from None
            raise
        except exc.DBAPIError as err:
            if err.connection_invalidated:
                raise DatabaseUnavailableError(self._message(err)) from None
            raise

    @staticmethod
    def _is_schema_missing(err: exc.SQLAlchemyError) -> bool:
        cause = getattr(err, "orig", None)
        if getattr(cause, "sqlstate", None) == _UNDEFINED_TABLE_SQLSTATE:
            return True
        return isinstance(err, exc.OperationalError) and "no such table" in str(cause or err).lower()

    def _is_unavailable(self, err: exc.SQLAlchemyError) -> bool:
        if self.dialect == "postgresql" or not isinstance(err, exc.OperationalError):
            return True
        text = str(err.orig).lower()
        return any(marker in text for marker in _SQLITE_UNAVAILABLE)

    def _is_access_refused(self, err: exc.SQLAlchemyError) -> bool:
        if self.dialect != "postgresql":
            return False
        cause = getattr(err, "orig", None)
        if getattr(cause, "sqlstate", None) in _ACCESS_SQLSTATES:
            return True
        return bool(_ACCESS_MESSAGES.search(str(cause or err)))

    def _message(self, err: exc.SQLAlchemyError, what: str = "unavailable") -> str:
        cause = getattr(err, "orig", None) or err
        lines = str(cause).strip().splitlines()
        detail = " ".join(lines[0].split()) if lines else type(cause).__name__  # one line: libpq's span several
        return self.scrub(f"database {self.url_redacted} {what}: {type(cause).__name__}: {detail}")

    def scrub(self, text: str) -> str:
        """``text`` with this database's password replaced by ``***``."""
        return text.replace(self._password, "***") if self._password else text

    # --- lifecycle ----------------------------------------------------------------------------------------------

    def schema_revision(self) -> str | None:
        """The schema's current revision (None for an empty database)."""
        with self.translate_errors(), self.engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()

    @staticmethod
    def head_revision() -> str:
        """The newest revision this code knows, which ``upgrade()`` brings a schema to."""
        head = ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()
        if head is None:  # pragma: no cover (the migrations ship with the package)
            raise RuntimeError(f"no migrations in {MIGRATIONS_DIR}")
        return head

    def upgrade(self, revision: str = "head") -> None:
        """Apply every Alembic migration up to ``revision`` (the latest by default). Idempotent. An empty database
        gets its whole schema in one transaction (no reader sees half of it); an existing one is upgraded in a
        transaction per migration (``migrations/env.py``)."""
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
        fresh = self.schema_revision() is None
        with self.translate_errors(), self.engine.begin() if fresh else self.engine.connect() as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, revision)
        log.info("database %s is at schema revision %s", self.url_redacted, revision)

    def downgrade(self, revision: str) -> None:
        """Undo the migrations after ``revision`` (each one's ``downgrade()``): the rollback to an older gpulens."""
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
        with self.translate_errors(), self.engine.connect() as conn:  # a transaction per migration (env.py)
            config.attributes["connection"] = conn
            command.downgrade(config, revision)
        log.info("database %s is at schema revision %s", self.url_redacted, revision)

    def ping(self) -> None:
        """One round trip: raises ``DatabaseUnavailableError`` (or ``DatabaseAccessError``) if it fails."""
        with self.session() as session:
            session.execute(sa.text("SELECT 1"))

    def size_bytes(self) -> int:
        """Bytes on disk: the SQLite file with its WAL, or pg_database_size."""
        if self.dialect == "postgresql":
            with self.session() as session:
                return int(session.execute(sa.text("SELECT pg_database_size(current_database())")).scalar_one())
        database = self.engine.url.database
        if not database or database == ":memory:":
            return 0
        return sum(p.stat().st_size for p in (Path(database), Path(database + "-wal")) if p.exists())

    def ensure_partitions(self, table: str, ts_values: Iterable[int]) -> None:
        """PostgreSQL: create the partitions of ``table`` that hold ``ts_values``, and the one after the newest.

        Each partition is created in its own short transaction, so collectors racing to create it do not fail.
        """
        if self.dialect != "postgresql":
            return
        width = partitions.PARTITION_WIDTH_MS[table]
        starts = {partitions.partition_start(table, ts) for ts in ts_values}
        starts |= {max(starts) + width} if starts else set()
        for start in sorted(starts - self._partitions.setdefault(table, set())):
            self._create_partition(table, start)
            self._partitions[table].add(start)

    def forget_partition(self, table: str, start: int) -> None:
        """Retention dropped a partition: create it again if data for it arrives."""
        self._partitions.get(table, set()).discard(start)

    def _create_partition(self, table: str, start: int) -> None:
        try:
            with self.translate_errors(), self.engine.begin() as conn:
                partitions.create_partition(conn, table, start)
        except (exc.IntegrityError, exc.ProgrammingError) as err:
            # Another collector created it between our IF NOT EXISTS check and the CREATE.
            with self.translate_errors(), self.engine.connect() as conn:
                if start not in partitions.existing_partitions(conn, table).values():
                    raise err from None

    def close(self) -> None:
        self.engine.dispose()

    def __repr__(self) -> str:
        return f"Database({self.url_redacted!r})"


def lock_tier(conn: Connection, tier: str, *, exclusive: bool) -> None:
    """Serialise a rollup tier's builder (exclusive) with the writers of its source (shared), until commit.

    PostgreSQL uses transaction-level advisory locks; on SQLite, BEGIN IMMEDIATE already serialises all writers.
    """
    if conn.dialect.name != "postgresql":
        return
    key = _LOCK_KEYS[tier]
    function = "pg_advisory_xact_lock" if exclusive else "pg_advisory_xact_lock_shared"
    conn.exec_driver_sql(f"SELECT {function}(%(key)s)", {"key": key})


class _BitOr:
    """SQLite's missing bit_or() aggregate (PostgreSQL has it): rollups and series OR throttle-reason bitmasks."""

    def __init__(self) -> None:
        self.value: int | None = None

    def step(self, value: int | None) -> None:
        if value is not None:
            self.value = value if self.value is None else self.value | value

    def finalize(self) -> int | None:
        return self.value


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # Let SQLAlchemy's "begin" event emit BEGIN itself (pysqlite's implicit transactions are off).
    dbapi_connection.isolation_level = None
    dbapi_connection.create_aggregate("bit_or", 1, _BitOr)
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA page_size=8192")  # takes effect only when the file is created
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA cache_size=-65536")
    finally:
        cursor.close()


def _sqlite_on_begin(conn: Connection) -> None:
    immediate = conn.get_execution_options().get("gpulens_write", False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")
