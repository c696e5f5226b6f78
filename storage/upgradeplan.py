"""The upgrade plan: each pending migration, what it changes, and what it will cost on the database at hand.

Everything is read from the Alembic scripts themselves, so a migration added later is planned like the others:
- what it changes: the first paragraph of its docstring;
- which tables it touches: the tables of this database that its source names (as a word);
- whether it copies or rewrites rows, and on which backend: the module's ``rewrites`` mapping (backend -> tables),
  where it has one; otherwise its source is read for statements that copy (``INSERT INTO ... SELECT``, a column's
  type change, a table recreated by batch mode), which count for every backend;
- whether it copies in batches into a new table swapped in at the end (its source uses ``migrations.tablecopy``), or
  rewrites the live table in place;
- whether ``gpulens db upgrade`` can be undone: its ``downgrade()`` exists and does not raise; and whether undoing it
  drops what it added (tables or columns, with their data).

The estimate is the rows copied divided by a rate measured on this project's benchmark machine
(``COPY_ROWS_PER_S``): a rough size for the maintenance window in minutes or hours, never a promise. A migration that
changes the schema only takes a brief lock; one that copies in batches only reads the live tables until the swap at
its end; one that rewrites in place holds its tables' exclusive lock for the whole rewrite (docs/upgrades.md).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import sqlalchemy as sa
from alembic.script import Script, ScriptDirectory

from gpulens.storage.db import MIGRATIONS_DIR, Database

# Rows copied per second by a whole upgrade that copies the sample table twice (bench/bench_upgrade.py: 288,000
# rows in batches, 0009 -> newest on SQLite 137,000 rows/s, 0006 -> newest on PostgreSQL 6,400 rows/s, the shared
# 2-core machine); the plan divides the rows it copies by these, so its figure errs long on a quiet server.
COPY_ROWS_PER_S: Final[Mapping[str, float]] = {"sqlite": 137_000.0, "postgresql": 6_400.0}

_COPY_PATTERNS: Final = (
    re.compile(r"INSERT\s+INTO\b[^;]*?\bSELECT\b", re.IGNORECASE | re.DOTALL),
    re.compile(r"ALTER\s+COLUMN\b[^;]*?\bTYPE\b", re.IGNORECASE | re.DOTALL),
    re.compile(r"\.alter_column\([^)]*type_\s*=", re.DOTALL),
    re.compile(r"recreate\s*=\s*[\"']always", re.DOTALL),
)
_DROPS: Final = re.compile(r"drop_table|drop_column|DROP\s+(TABLE|COLUMN)", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class PlannedStep:
    """One pending migration on one database."""

    revision: str
    changes: str  # the first paragraph of the migration's docstring, on one line
    tables: Mapping[str, int]  # the tables it names that this database has, with their rows (estimated on PostgreSQL)
    copies: tuple[str, ...]  # of those, the ones whose rows it copies or rewrites on this backend
    reversible: bool
    downgrade_drops: bool  # undoing it drops tables or columns it added, with their data
    batched: bool = False  # copies in batches into a new table, swapped in at the end (migrations.tablecopy)

    @property
    def rows_copied(self) -> int:
        return sum(self.tables.get(t, 0) for t in self.copies)

    def seconds(self, dialect: str) -> float:
        """The estimated time of the copy (0 for a change of the schema only)."""
        return self.rows_copied / COPY_ROWS_PER_S.get(dialect, COPY_ROWS_PER_S["postgresql"])

    def lock(self, dialect: str) -> str:
        """What it locks, and for about how long, in words."""
        if not self.copies:
            return "schema only: a brief lock"
        held = ", ".join(self.copies)
        if dialect == "sqlite":
            how = "in batches, " if self.batched else ""
            return f"the database's write lock while it copies {held} {how}(readers go on reading the old rows)"
        if self.batched:
            return f"ACCESS SHARE on {held} while copied in batches (readers go on), ACCESS EXCLUSIVE for the swap"
        return f"ACCESS EXCLUSIVE on {held} (readers and writers wait) for the copy"


def scripts() -> ScriptDirectory:
    return ScriptDirectory(str(MIGRATIONS_DIR))


def pending(db: Database) -> list[Script]:
    """The migrations between the database's revision and the newest, oldest first."""
    current = db.schema_revision()
    return list(reversed(list(scripts().iterate_revisions("heads", current or "base"))))


def plan(db: Database) -> list[PlannedStep]:
    """Each pending migration of ``db``, oldest first, with the rows of the tables it touches now."""
    steps = pending(db)
    counts = _row_counts(db) if steps else {}
    return [_step(script, counts, db.dialect) for script in steps]


def _step(script: Script, counts: Mapping[str, int], dialect: str) -> PlannedStep:
    module = script.module
    source = inspect.getsource(module)
    named = {t: n for t, n in counts.items() if re.search(rf"\b{re.escape(t)}\b", source)}
    declared = getattr(module, "rewrites", None)
    if isinstance(declared, Mapping):
        copies = tuple(t for t in declared.get(dialect, ()) if t in named)
    elif any(p.search(source) for p in _COPY_PATTERNS):
        copies = tuple(named)
    else:
        copies = ()
    downgrade = getattr(module, "downgrade", None)
    body = inspect.getsource(downgrade) if callable(downgrade) else ""
    reversible = callable(downgrade) and "raise " not in body
    return PlannedStep(
        revision=script.revision,
        changes=_first_paragraph(module.__doc__ or script.doc or ""),
        tables=named,
        copies=copies,
        reversible=reversible,
        downgrade_drops=bool(_DROPS.search(body)),
        batched=bool(copies) and "tablecopy." in source,
    )


def _first_paragraph(doc: str) -> str:
    return " ".join(doc.strip().split("\n\n", 1)[0].split())


def _row_counts(db: Database) -> dict[str, int]:
    """Rows of each table: exact on SQLite (``count(*)``, a scan of the smallest index), the planner's estimate on
    PostgreSQL (``reltuples`` of the table and its partitions; a count where it was never analysed)."""
    with db.translate_errors(), db.engine.connect() as conn:
        names = sa.inspect(conn).get_table_names()
        if db.dialect != "postgresql":
            return {t: _count(conn, t) for t in names}
        estimate = sa.text(
            "SELECT coalesce(sum(greatest(c.reltuples, 0)), 0), bool_or(c.reltuples < 0) FROM pg_class c "
            "WHERE c.relkind <> 'p' AND (c.oid = CAST(:t AS regclass) OR c.oid IN "
            "(SELECT inhrelid FROM pg_inherits WHERE inhparent = CAST(:t AS regclass)))"
        )
        counts: dict[str, int] = {}
        for t in names:
            rows, unknown = conn.execute(estimate, {"t": t}).one()
            if unknown:
                rows = _count(conn, t)
            counts[t] = int(rows)
        return counts


def _count(conn: sa.Connection, table: str) -> int:
    return int(conn.execute(sa.select(sa.func.count()).select_from(sa.table(table))).scalar_one())
