"""Opening a store: connect and migrate for writers, or open an existing store for readers without creating one.

The one place that dispatches on a store URL's scheme: SQLAlchemy URLs are SQL stores (read and written);
``prometheus+http(s)://`` is a Prometheus-compatible query API, read through ``storage.prometheus`` and never
written (``open_database`` refuses it in one line that says what to do instead).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import sqlalchemy as sa

from gpulens.config import ConfigError
from gpulens.httpfetch import redact_url
from gpulens.settings import Settings, StoreAuth
from storage.db import Database
from storage.reading import SqlReader, StoreReader

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
    if upgrade:
        try:
            db.upgrade()
        except BaseException:
            db.close()
            raise
    return db


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


def open_reader(url: str, settings: Settings | None = None) -> StoreReader:
    """A reader over the store at ``url``: SQL (which must exist) or Prometheus (credentials from ``settings``)."""
    if is_prometheus_url(url):
        from storage.prometheus import PromReader

        return PromReader(url, settings.store_auth if settings is not None else StoreAuth())
    return SqlReader(open_existing_database(url))
