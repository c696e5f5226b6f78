"""Storage: the SQL store (schema and migrations, the writer, rollups, retention, the read path) and the read
interface every store serves (``gpulens.storage.reading``), over SQL or Prometheus (``gpulens.storage.prometheus``).

The SQL read path is ``gpulens.storage.latest`` (the cluster now), ``gpulens.storage.timeseries`` (series across
tiers), ``gpulens.storage.jobstats`` (per-job statistics, from the writer's per-job aggregate
``gpulens.storage.jobminute``) and ``gpulens.storage.inventory`` (GPU info, NVLink outages, target health), served as
one reader by ``gpulens.storage.sqlreader``. The records every reader returns are in ``gpulens.storage.records``.

Only this package imports SQLAlchemy, and only the SQL modules do: the names below are loaded when first used, so
importing ``gpulens.storage.prometheus`` (or ``reading``, ``records``) loads no SQL library. See docs/storage.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gpulens.extras import require_server

require_server("gpulens.storage", "sqlalchemy", "alembic")

if TYPE_CHECKING:
    from gpulens.storage.db import Database, DatabaseAccessError, DatabaseUnavailableError, redact_url
    from gpulens.storage.retention import Retention, apply_retention
    from gpulens.storage.rollup import Rollups
    from gpulens.storage.writer import Writer, WriteStats

_HOME = {
    "Database": "db",
    "DatabaseAccessError": "db",
    "DatabaseUnavailableError": "db",
    "redact_url": "db",
    "Retention": "retention",
    "apply_retention": "retention",
    "Rollups": "rollup",
    "Writer": "writer",
    "WriteStats": "writer",
}

__all__ = [
    "Database",
    "DatabaseAccessError",
    "DatabaseUnavailableError",
    "Retention",
    "Rollups",
    "WriteStats",
    "Writer",
    "apply_retention",
    "redact_url",
]


def __getattr__(name: str) -> Any:
    """The SQL names, imported on first use (PEP 562)."""
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'gpulens.storage' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"gpulens.storage.{home}"), name)
    globals()[name] = value
    return value
