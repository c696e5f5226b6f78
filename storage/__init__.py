"""SQL storage: the schema and migrations, the writer, rollups, retention and the read path.

The read path is ``gpulens.storage.latest`` (the cluster now), ``gpulens.storage.timeseries`` (series across tiers),
``gpulens.storage.jobstats`` (per-job statistics, from the writer's per-job aggregate ``gpulens.storage.jobminute``) and
``gpulens.storage.inventory`` (GPU info, NVLink outages, target health).

Only this package imports SQLAlchemy. See docs/storage.md.
"""

from gpulens.extras import require_server

require_server("gpulens.storage", "sqlalchemy", "alembic")

from gpulens.storage.db import Database, DatabaseAccessError, DatabaseUnavailableError, redact_url  # noqa: E402
from gpulens.storage.retention import Retention, apply_retention  # noqa: E402
from gpulens.storage.rollup import Rollups  # noqa: E402
from gpulens.storage.writer import Writer, WriteStats  # noqa: E402

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
