"""Stores at the newest schema for tests, copied from one store migrated once per test process.

Migrating a new store runs every Alembic revision: hundreds of statements, seconds on a loaded machine. A test that
needs a store at head but does not test the migrations gets a copy instead: a file copy on SQLite, and
``CREATE DATABASE ... TEMPLATE`` on PostgreSQL. The migrations themselves are still run and checked, once per process
here and revision by revision in tests/storage/test_migrations.py.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

from gpulens.clock import ManualClock
from gpulens.storage.db import Database

_sqlite_template: Path | None = None


def _migrate(url: str) -> None:
    database = Database(url, clock=ManualClock(0.0))
    try:
        database.upgrade()
    finally:
        database.close()


def migrated_sqlite(path: Path) -> str:
    """The URL of a new SQLite store at ``path`` at the newest schema revision (``path`` must not exist)."""
    global _sqlite_template
    if _sqlite_template is None:
        folder = Path(tempfile.mkdtemp(prefix="gpulens-template-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        template = folder / "template.db"
        _migrate(f"sqlite:///{template}")
        for leftover in (Path(f"{template}-wal"), Path(f"{template}-shm")):
            if leftover.exists():  # a clean close leaves none; a copy without it would lose the schema
                raise RuntimeError(f"the template store left {leftover} behind")
        _sqlite_template = template
    if path.exists():
        raise FileExistsError(path)
    shutil.copyfile(_sqlite_template, path)
    return f"sqlite:///{path}"


def migrate_once(url: str) -> None:
    """Bring the (PostgreSQL) template database at ``url`` to the newest revision."""
    _migrate(url)
