"""Collector fixtures: the same SQLite and throwaway PostgreSQL stores as the storage tests."""

from __future__ import annotations

from tests.storage.conftest import _pg_root, clock, db, db_url, pg_server, private_pg_server

__all__ = ["_pg_root", "clock", "db", "db_url", "pg_server", "private_pg_server"]
