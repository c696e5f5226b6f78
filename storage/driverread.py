"""Short, hot reads through the database driver's own cursor, inside a session's transaction.

SQLAlchemy's execution path (finding the compiled statement, expanding its ``IN`` lists, building a result and its
rows) costs more than a short read itself. A one-GPU range of 18 points on SQLite took 2.1 ms through it, of which
the two queries were 0.3 ms; through the driver's cursor the same read takes 1.4 ms (``bench_prom_peer``'s "one GPU
over the range" and docs/storage-reading.md, "Short reads through the driver"). ``rows`` hands a statement and its
parameters to the driver as they are, in the session's transaction (a pinned page view keeps its one snapshot), and
returns plain tuples. It fires the engine's ``before_cursor_execute`` and ``after_cursor_execute`` listeners as
SQLAlchemy would (the query-count bound tests and the query-plan tests listen there), and wraps a driver error as
SQLAlchemy does, so ``Database.translate_errors`` sees the same exceptions either way.

Statements are written with ``:name`` parameters, as ``sa.text`` takes them; PostgreSQL's driver gets them as
``%(name)s``; an ``IN`` list is a list of parameters (``in_list``). Use this only for short, frequent reads whose
statements are constants; everything else goes through SQLAlchemy.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from sqlalchemy import exc
from sqlalchemy.orm import Session

_NAMED: Final = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")  # ":name", not a PostgreSQL "::type" cast


@functools.lru_cache(maxsize=256)
def driver_sql(sql: str, paramstyle: str) -> str:
    """``sql`` with its ``:name`` parameters in the driver's style (``named`` and ``qmark`` drivers take ``:name``
    with a mapping; ``pyformat`` ones ``%(name)s``, with a literal ``%`` doubled)."""
    if paramstyle != "pyformat":
        return sql
    return _NAMED.sub(r"%(\1)s", sql.replace("%", "%%"))


def in_list(name: str, values: Iterable[Any]) -> tuple[str, dict[str, Any]]:
    """An ``IN`` list of parameters ``:name0, :name1...`` and their values (``(NULL)``, matching nothing, when
    empty). Bound, not literals: SQLite reads a literal list of 8 ids over an hour 40 % slower than the same list
    bound (docs/storage-reading.md, "Short reads through the driver")."""
    params = {f"{name}{i}": value for i, value in enumerate(values)}
    return f"({', '.join(f':{key}' for key in params) or 'NULL'})", params


def rows(session: Session, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """Every row of ``sql`` with ``params``, read through the driver's cursor in ``session``'s transaction."""
    conn = session.connection()
    dialect = conn.dialect
    statement = driver_sql(sql, dialect.paramstyle)
    cursor = conn.connection.cursor()
    try:
        conn.dispatch.before_cursor_execute(conn, cursor, statement, params, None, False)
        cursor.execute(statement, params)
        conn.dispatch.after_cursor_execute(conn, cursor, statement, params, None, False)
        return list(cursor.fetchall())
    except dialect.loaded_dbapi.Error as err:
        raise exc.DBAPIError.instance(
            statement, None, err, dialect.loaded_dbapi.Error, hide_parameters=True, dialect=dialect
        ) from err
    finally:
        cursor.close()
