"""Opening a store: connect and migrate for writers, or open an existing store for readers without creating one."""

from __future__ import annotations

import logging
from pathlib import Path

import sqlalchemy as sa

from gpulens.config import ConfigError
from storage.db import Database, DatabaseAccessError, DatabaseUnavailableError

log = logging.getLogger(__name__)


def open_database(url: str, *, upgrade: bool = True) -> Database:
    """Connect and bring the schema up to date (migrations run at start-up)."""
    db = Database(url)
    if upgrade:
        try:
            db.upgrade()
        except BaseException:
            db.close()
            raise
    return db


def open_database_when_reachable(url: str) -> tuple[Database, bool]:
    """Connect and migrate if the database answers; if it is down, return it unmigrated (``False``) so the caller
    runs and spools, and migrates (``Database.upgrade``) once it is back. A wrong password, an unknown role or a
    missing database raise ``DatabaseAccessError``: waiting will not cure them."""
    db = Database(url)
    try:
        db.upgrade()
    except DatabaseAccessError:
        db.close()
        raise
    except DatabaseUnavailableError as exc:
        log.warning("%s; starting anyway: rounds are spooled and the schema is migrated once it is back", exc)
        return db, False
    except BaseException:
        db.close()
        raise
    return db, True


def open_existing_database(url: str) -> Database:
    """Open a store for reading, refusing to create one: a mistyped URL must not look like an empty cluster."""
    parsed = sa.engine.make_url(url)
    sqlite_file = parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:")
    file = parsed.database if sqlite_file else None
    if file is not None and not Path(file).exists():
        raise ConfigError(f"no database at {file} (start the collector first, or give --db / --config)", key="--db")
    db = Database(url)
    try:
        with db.translate_errors():
            present = sa.inspect(db.engine).has_table("gpu")
    except BaseException:
        db.close()
        raise
    if not present:
        db.close()
        raise ConfigError(f"{db.url_redacted} holds no gpulens data (start the collector, or run gpulens db upgrade)")
    return db
