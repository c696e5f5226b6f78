"""Dashboard fixtures: a database filled once per session from the test scenario, and the app over it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpulens.clock import ManualClock
from gpulens.dashboard.app import create_app
from gpulens.storage.db import Database
from tests.dashboard.cluster import Filled, fill
from tests.dbtemplate import migrated_sqlite


@dataclass(frozen=True)
class Store:
    db: Database
    clock: ManualClock
    filled: Filled


@pytest.fixture(scope="session")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """The scenario's hour written to SQLite, with the clock at the scenario's end (the stall is still on)."""
    path: Path = tmp_path_factory.mktemp("dashboard") / "gpulens.db"
    clock = ManualClock(0.0)
    db = Database(f"sqlite:///{path}", clock=clock)
    filled = fill(db)
    clock.set(filled.end)
    yield Store(db, clock, filled)
    db.close()


@pytest.fixture
def empty_db(tmp_path: Path) -> Iterator[Database]:
    """A database with the schema and nothing in it (the collector has not written yet)."""
    db = Database(migrated_sqlite(tmp_path / "empty.db"), clock=ManualClock(1_767_225_600.0))
    yield db
    db.close()


@pytest.fixture(scope="session")
def app_over_store(store: Store):  # type: ignore[no-untyped-def]
    return create_app(store.db, alerts=store.filled.alerts)
