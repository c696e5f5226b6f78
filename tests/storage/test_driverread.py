"""Short reads through the driver's cursor (``storage.driverread``): the driver's parameter style, ``IN`` lists as
parameters, the session's transaction, the engine's listeners, and driver errors wrapped as SQLAlchemy wraps them."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from gpulens.storage import driverread, timeseries
from gpulens.storage.db import Database
from gpulens.storage.writer import Writer
from tests.storage.conftest import T0
from tests.storage.data import snapshot, uuid_of
from tests.storage.test_query_bounds import counting


def test_driver_sql_in_each_style() -> None:
    sql = "SELECT a % 2, b::text, '12:30' FROM t WHERE a >= :lo AND b < :hi_1 LIMIT :limit"
    assert driverread.driver_sql(sql, "qmark") == sql  # sqlite3 takes :name with a mapping
    assert driverread.driver_sql(sql, "pyformat") == (
        "SELECT a %% 2, b::text, '12:30' FROM t WHERE a >= %(lo)s AND b < %(hi_1)s LIMIT %(limit)s"
    )


def test_in_list_is_parameters() -> None:
    assert driverread.in_list("id", [3, 1]) == ("(:id0, :id1)", {"id0": 3, "id1": 1})
    assert driverread.in_list("u", []) == ("(NULL)", {})


def test_rows_read_in_the_session_and_are_counted(db: Database) -> None:
    Writer(db).write([snapshot("n", T0 + 10 * k, gpus=2) for k in range(3)])
    with counting(db) as tally, db.session() as session:
        found = driverread.rows(session, "SELECT gpu_id, ts_ms FROM gpu_sample WHERE ts_ms >= :lo ORDER BY 1, 2",
                                {"lo": round((T0 + 10) * 1000)})  # fmt: skip
        again = session.execute(sa.text("SELECT count(*) FROM gpu_sample")).scalar_one()
    assert [type(row) for row in found] == [tuple] * 4
    assert sorted({row[1] for row in found}) == [round((T0 + 10) * 1000), round((T0 + 20) * 1000)]
    assert again == 6
    assert tally.statements == 2  # the driver's read is seen by the engine's listeners like any other


def test_a_uuid_is_a_parameter_never_sql(db: Database) -> None:
    Writer(db).write([snapshot("n", T0)])
    hostile = "x') OR 1 = 1 --"
    assert timeseries.series(db, [hostile], ["power_watts"], T0 - 60, T0 + 60) == {}
    assert timeseries.series(db, [], ["power_watts"], T0 - 60, T0 + 60) == {}
    both = timeseries.series(db, [hostile, uuid_of("n", 0)], ["power_watts"], T0 - 60, T0 + 60)
    assert list(both) == [uuid_of("n", 0)]


def test_driver_errors_are_wrapped_as_sqlalchemy_wraps_them(db: Database) -> None:
    """SQLAlchemy's exception types, so ``Database.translate_errors`` tells an unavailable store as it always does."""
    with pytest.raises(sa.exc.ProgrammingError if db.dialect == "postgresql" else sa.exc.OperationalError), \
            db.session() as session:  # fmt: skip
        driverread.rows(session, "SELECT no_such_column FROM gpu", {})
