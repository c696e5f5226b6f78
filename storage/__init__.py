"""SQL storage: the schema and migrations, the writer, rollups, retention and the read path (``storage.queries``).

Only this package imports SQLAlchemy. See docs/storage.md.
"""

from storage.db import Database, DatabaseAccessError, DatabaseUnavailableError, redact_url
from storage.retention import Retention, apply_retention
from storage.rollup import Rollups
from storage.writer import Writer, WriteStats

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
