"""Alembic environment: migrations run on the connection that ``Database.upgrade`` passes in."""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from gpulens.storage.schema import metadata


def run_migrations() -> None:
    connection = context.config.attributes.get("connection")
    if not isinstance(connection, Connection):
        raise RuntimeError("run migrations with gpulens.storage.db.Database.upgrade() or `gpulens db upgrade`")
    context.configure(connection=connection, target_metadata=metadata)
    with context.begin_transaction():
        context.run_migrations()


run_migrations()
