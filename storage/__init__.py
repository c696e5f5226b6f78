"""SQL storage: the schema and migrations, the writer, rollups, retention and the read path.

The read path is ``storage.latest`` (the cluster now), ``storage.timeseries`` (series across tiers),
``storage.jobstats`` (per-job statistics, from the writer's per-job aggregate ``storage.jobminute``) and
``storage.inventory`` (GPU info, NVLink outages, target health).

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
