"""Alembic environment: migrations run on the connection that ``Database.upgrade`` passes in, each migration in a
transaction of its own (an upgrade across several revisions commits after each: the locks of one migration's swap
are not held through the next one's copy, and an upgrade that stops leaves the database at the last revision done),
unless the connection is already in a transaction (an empty database's whole schema: one transaction)."""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from gpulens.storage.schema import metadata


def run_migrations() -> None:
    connection = context.config.attributes.get("connection")
    if not isinstance(connection, Connection):
        raise RuntimeError("run migrations with gpulens.storage.db.Database.upgrade() or `gpulens db upgrade`")
    context.configure(connection=connection, target_metadata=metadata, transaction_per_migration=True)
    with context.begin_transaction():
        context.run_migrations()


run_migrations()
