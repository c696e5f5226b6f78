"""Opening a store: connect and migrate for writers, or open an existing store for readers without creating one.

The one place that dispatches on a store URL's scheme: SQLAlchemy URLs are SQL stores (read and written);
``prometheus+http(s)://`` is a Prometheus-compatible query API, read through ``gpulens.storage.prometheus`` and never
written (``open_database`` refuses it in one line that says what to do instead).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Final

import sqlalchemy as sa

from gpulens.config import ConfigError
from gpulens.settings import Settings, StoreAuth
from gpulens.storage.db import Database, DatabaseAccessError, DatabaseUnavailableError, DatabaseURLError, redact_url
from gpulens.storage.reading import StoreReader
from gpulens.storage.sqlreader import SqlReader

if TYPE_CHECKING:
    from gpulens.storage.prometheus import PromReader

log = logging.getLogger(__name__)


def check_database_url(url: str) -> None:
    """Raise ``DatabaseURLError`` unless ``url`` is one gpulens can use: a supported scheme and driver, and for
    SQLite a file in a directory that exists; a Prometheus URL is left to its reader. Connects to nothing."""
    if is_prometheus_url(url):
        return
    Database(url).close()  # parses and checks the scheme and driver; an engine connects only when used
    _check_sqlite_file(url)


def _sqlite_file(url: str) -> Path | None:
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def _check_sqlite_file(url: str) -> None:
    file = _sqlite_file(url)
    if file is None:
        return
    if file.is_dir():
        raise DatabaseURLError(redact_url(url), f"{file} is a directory (expected sqlite:///PATH/TO/FILE.db)")
    parent = file.parent
    if not parent.is_dir():
        what = "is not a directory" if parent.exists() else "does not exist"
        raise DatabaseURLError(
            redact_url(url), f"directory {parent} {what} (create it, or give a file in an existing directory)"
        )


@contextmanager
def _not_a_database(db: Database) -> Iterator[None]:
    """What the driver says when the URL leads to something that is not a database (SQLite: a text file)."""
    try:
        yield
    except sa.exc.DatabaseError as err:
        if isinstance(err, sa.exc.OperationalError) and db.dialect == "postgresql":
            raise
        detail = (str(err.orig or err).strip().splitlines() or ["unknown error"])[0]
        raise DatabaseURLError(db.url_redacted, f"not a usable database: {db.scrub(detail)}") from None


PROMETHEUS_SCHEMES: Final = ("prometheus+http", "prometheus+https")


def is_prometheus_url(url: str) -> bool:
    """True for ``prometheus+http(s)://...``: a read-only store."""
    return url.split("://", 1)[0].strip().lower() in PROMETHEUS_SCHEMES


def refuse_read_only(url: str, command: str) -> None:
    """Raise ``ConfigError`` when ``url`` is a Prometheus store that ``command`` would have to write."""
    if is_prometheus_url(url):
        raise ConfigError(
            f"{command}: {redact_url(url)} is a Prometheus store, which gpulens reads but never writes; give a SQL "
            "--db (sqlite:///FILE or postgresql+psycopg://...), or let Prometheus scrape the exporters and run "
            "gpulens dashboard / query / alerts run over it (docs/prometheus.md)",
            key="--db",
        )


def open_database(url: str, *, upgrade: bool = True) -> Database:
    """Connect and bring the schema up to date (migrations run at start-up). A Prometheus URL is refused."""
    refuse_read_only(url, "writing")
    db = Database(url)
    try:
        _check_sqlite_file(url)
        if upgrade:
            upgrade_schema(db)
    except BaseException:
        db.close()
        raise
    return db


def upgrade_schema(db: Database, announce: Callable[[str | None, str], None] | None = None) -> None:
    """Bring ``db``'s schema to the newest revision; ``announce(current, newest)`` is called first when it is behind
    (a revision may copy the sample tables: minutes on a large store)."""
    with _not_a_database(db):
        if announce is not None and (current := db.schema_revision()) != (newest := db.head_revision()):
            announce(current, newest)
        db.upgrade()


class SchemaBehindError(ConfigError):
    """The store's schema is older than this gpulens and the caller was not told to migrate it."""


def ensure_schema(db: Database, *, migrate: bool) -> None:
    """Make ``db`` usable by this code: an empty database gets the whole schema (nothing to copy, nothing locked for
    long); one at an older revision is migrated only with ``migrate``, and otherwise ``SchemaBehindError`` says in one
    line what to run. A schema newer than this code is refused (``db.upgrade`` names the unknown revision)."""
    with _not_a_database(db):
        current = db.schema_revision()
        newest = db.head_revision()
        if current == newest:
            return
        if current is not None and not migrate and is_known_revision(current):
            raise SchemaBehindError(
                f"database {db.url_redacted} is at schema revision {current} and this gpulens needs {newest}: "
                f"run gpulens db upgrade --plan, back up, then gpulens db upgrade (docs/upgrades.md), or start "
                "with --migrate"
            )
        db.upgrade()


def is_known_revision(revision: str) -> bool:
    """True when ``revision`` is one of this code's migrations (a newer gpulens's is not)."""
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    from gpulens.storage.db import MIGRATIONS_DIR

    try:
        return ScriptDirectory(str(MIGRATIONS_DIR)).get_revision(revision) is not None
    except CommandError:
        return False


def open_database_when_reachable(url: str, *, migrate: bool = False) -> tuple[Database, bool]:
    """Connect and check the schema (``ensure_schema``: created when empty, migrated only with ``migrate``) if the
    database answers; if it is down, return it unchecked (``False``) so the caller runs and spools, and checks it
    once it is back. A wrong password, an unknown role or a missing database raise ``DatabaseAccessError``, and a
    schema behind this code without ``migrate`` ``SchemaBehindError``: waiting will not cure them."""
    db = Database(url)
    try:
        _check_sqlite_file(url)
        ensure_schema(db, migrate=migrate)
    except DatabaseAccessError:
        db.close()
        raise
    except DatabaseUnavailableError as exc:
        log.warning("%s; starting anyway: rounds are spooled and the schema is checked once it is back", exc)
        return db, False
    except BaseException:
        db.close()
        raise
    return db, True


def open_existing_database(url: str) -> Database:
    """Open a store for reading, refusing to create one: a mistyped URL must not look like an empty cluster."""
    db = Database(url)  # first: a URL gpulens cannot use says so before anything else
    try:
        file = _sqlite_file(url)
        if file is not None and not file.exists():
            raise DatabaseURLError(
                db.url_redacted, f"no database at {file} (start the collector first, or give --db / --config)"
            )
        _check_sqlite_file(url)
        with _not_a_database(db), db.translate_errors():
            present = sa.inspect(db.engine).has_table("gpu")
    except BaseException:
        db.close()
        raise
    if not present:
        db.close()
        raise ConfigError(f"{db.url_redacted} holds no gpulens data (start the collector, or run gpulens db upgrade)")
    return db


def open_reader(url: str, settings: Settings | None = None) -> StoreReader:
    """A reader over the store at ``url``: SQL (which must exist) or Prometheus (credentials from ``settings``)."""
    if is_prometheus_url(url):
        return open_prometheus(url, settings)
    return SqlReader(open_existing_database(url))


def open_prometheus(url: str, settings: Settings | None = None) -> PromReader:
    """The Prometheus reader at ``url`` (``prometheus+http(s)://``), for a caller that uses what only it offers (the
    alert engine's round reads, ``gpulens.alerts.promround``); credentials from ``settings``."""
    from gpulens.storage.prometheus import PromReader

    return PromReader(url, settings.store_auth if settings is not None else StoreAuth())
