"""GPU profiles: the seldom-changing fields of a reading, stored once per distinct combination in ``gpu_profile``.

A sample row names its combination by ``profile_id`` (revision 0008; see docs/storage-schema.md, "Profiles").
``Profiles`` keeps the combinations stored so far in memory, keyed by their SI values, and stores a new one with an
idempotent insert, which two collectors writing the same store can both run. Reads join the table back
(``schema.sample_source``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from operator import attrgetter
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpulens.model import GpuReading
from gpulens.storage import schema

FIELDS: Final = tuple(f for f in schema.SAMPLE_FIELDS if f.profile)
# A reading's profile values, in FIELDS order: what a GPU's previous profile is compared with, reading by reading.
VALUES: Final[Callable[[GpuReading], tuple[Any, ...]]] = attrgetter(*(f.name for f in FIELDS))


def _insert(dialect: str) -> str:
    """An idempotent INSERT of one profile: its key, then its SI values (``:p0``...) encoded like a sample's."""
    values = [
        f.sql_encode(f":p{i}" if dialect == "sqlite" else f"CAST(:p{i} AS {f.pg_param_type})", dialect)
        for i, f in enumerate(FIELDS)
    ]
    columns = ", ".join(f.column for f in FIELDS)
    return (
        f"INSERT INTO gpu_profile (key, {columns}) VALUES (:key, {', '.join(values)}) "  # noqa: S608
        "ON CONFLICT (key) DO NOTHING"
    )


_INSERT: Final = {dialect: sa.text(_insert(dialect)) for dialect in ("sqlite", "postgresql")}
_ID: Final = sa.text("SELECT profile_id FROM gpu_profile WHERE key = :key")


class Profiles:
    """The stored profiles by their SI values (``key`` is their JSON); ``id_of`` stores a new combination first."""

    def __init__(self, dialect: str) -> None:
        self._dialect = dialect
        self._ids: dict[tuple[Any, ...], int] = {}

    def load(self, conn: Connection) -> None:
        """Every stored profile the writer can name by its values (the migration's keys hold stored values)."""
        p = schema.gpu_profile
        self._ids = {}
        for profile_id, key in conn.execute(sa.select(p.c.profile_id, p.c.key)):
            if key.startswith("["):  # not a key of the migration's (written from stored values)
                self._ids[tuple(json.loads(key))] = profile_id

    def reset(self) -> None:
        """Forget what is stored (a failed transaction): ``load`` again before the next ``id_of``."""
        self._ids = {}

    def id_of(self, conn: Connection, values: tuple[Any, ...]) -> int:
        """The id of the profile holding ``values`` (the profile fields' SI values), stored first if it is new."""
        profile_id = self._ids.get(values)
        if profile_id is None:
            key = json.dumps(values)
            params = {"key": key, **{f"p{i}": value for i, value in enumerate(values)}}
            conn.execute(_INSERT[self._dialect], params)
            profile_id = self._ids[values] = int(conn.execute(_ID, {"key": key}).scalar_one())
        return profile_id
