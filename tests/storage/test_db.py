"""The database handle: migrations, URL redaction, and DatabaseUnavailableError on SQLite and PostgreSQL."""

from __future__ import annotations

import logging
import sqlite3
import traceback
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

# fabricschema, hardwarestore, inspectorstore, jobminute, jobsummary, ncclstore and slurmtables each add their tables
# to schema.metadata, which the comparison with the migrated database reads: imported so that the test means the same
# alone as in the suite
from gpulens.storage import (  # noqa: F401
    fabricschema,
    hardwarestore,
    inspectorstore,
    jobminute,
    jobsummary,
    latest,
    ncclstore,
    schema,
    slurmtables,
)
from gpulens.storage.db import MIGRATIONS_DIR, Database, DatabaseUnavailableError, redact_url
from gpulens.storage.writer import Writer
from tests.storage.conftest import SECRET_PASSWORD, SECRET_ROLE, T0, PgServer
from tests.storage.data import snapshot


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql+psycopg://gpulens:hunter2@db:5432/gpulens", "postgresql+psycopg://gpulens:***@db:5432/gpulens"),
        ("postgresql://u:p%40ss@h/d?sslmode=require", "postgresql://u:***@h/d?sslmode=require"),
        ("postgresql+psycopg://u@h/d?password=hunter2", "postgresql+psycopg://u@h/d?password=%2A%2A%2A"),
        ("sqlite:///gpulens.db", "sqlite:///gpulens.db"),
        ("not a url://user:hunter2@host", "not a url://user:***@host"),
    ],
)
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected


def test_invalid_and_unsupported_urls_are_value_errors_without_the_password() -> None:
    with pytest.raises(ValueError, match="invalid database URL") as invalid:
        Database("::::hunter2@")
    assert "hunter2" not in str(invalid.value)
    with pytest.raises(ValueError, match="unsupported database") as unsupported:
        Database("mysql://root:hunter2@localhost/db")
    assert "hunter2" not in str(unsupported.value)


SAMPLE_KEYS = {
    **{"gpu_sample": "gpu_id", "nic_sample": "nic_id"},
    **{"host_sample": "host_id", "job_host_sample": "job_host_id"},
}


def test_upgrade_is_idempotent_and_matches_the_schema(db: Database) -> None:
    db.upgrade()
    db.upgrade()
    with db.engine.connect() as conn:
        version = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar_one()
        assert version == ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()
        context = MigrationContext.configure(conn, opts={"include_object": _comparable})
        assert compare_metadata(context, schema.metadata) == []
        inspector = sa.inspect(conn)
        for table, id_column in SAMPLE_KEYS.items():
            key = inspector.get_pk_constraint(table)["constrained_columns"]
            columns = {c["name"] for c in inspector.get_columns(table)}
            if db.dialect == "sqlite":  # clustered by minute, no index beside the key, ts_ms generated (0010, 0011)
                assert key == ["minute", id_column, "ms"]
                generated = {c["name"] for c in inspector.get_columns(table) if c.get("computed")}
                assert generated == {"ts_ms"}
                assert inspector.get_indexes(table) == []
                (options,) = conn.exec_driver_sql("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).one()
                assert str(options).rstrip().endswith("WITHOUT ROWID")
                assert f"GENERATED ALWAYS AS ({schema.sqlite_ts_ms()}) VIRTUAL" in str(options)  # as reads assume
            else:
                assert key == []
                assert not {"minute", "ms"} & columns
        if db.dialect == "postgresql":
            indexes = {index["name"] for index in inspector.get_indexes("gpu_sample")}
            assert {"ux_gpu_sample_gpu_ts", "ix_gpu_sample_ts_brin"} <= indexes
    with db.session() as session:
        tiers = session.execute(sa.select(schema.tier_state.c.tier).order_by(schema.tier_state.c.tier)).scalars()
        assert list(tiers) == ["1h", "1m", "job", "raw"]  # "job": the per-job aggregate's horizon (revision 0009)


_DIALECT_INDEXES = (
    *("ux_gpu_sample_minute_gpu_ts", "ux_gpu_sample_gpu_ts", "ix_gpu_sample_ts_brin"),
    *(
        f"{prefix}_{family}_sample_{suffix}"
        for family in ("nic", "host", "job_host")
        for prefix, suffix in (("ux", "minute_key_ts"), ("ux", "key_ts"), ("ix", "ts_brin"))
    ),
)


def _comparable(obj: object, name: str | None, type_: str, reflected: bool, compare_to: object) -> bool:
    """Leave out what autogenerate cannot compare: PostgreSQL partitions, the indexes of one dialect, and the
    columns of SQLite's alone (checked in the test instead)."""
    if type_ == "table" and reflected and compare_to is None and name is not None and "_p" in name:
        return False
    if type_ == "column" and not reflected and isinstance(obj, sa.Column) and "dialects" in obj.info:
        return False  # on a dialect it is meant for, it is there: a missing column would fail the test's checks
    return not (type_ == "index" and name in _DIALECT_INDEXES)


def test_size_bytes_grows_with_data(db: Database) -> None:
    before = db.size_bytes()
    Writer(db).write([snapshot(f"n{i}", T0 + k, gpus=8) for i in range(20) for k in range(10)])
    assert before > 0
    assert db.size_bytes() > before


def test_sqlite_file_that_cannot_be_opened(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'missing-dir' / 'gpulens.db'}")
    with pytest.raises(DatabaseUnavailableError, match="unable to open"):
        db.upgrade()
    db.close()


def test_sqlite_locked_too_long(tmp_path: Path) -> None:
    path = tmp_path / "gpulens.db"
    db = Database(f"sqlite:///{path}?timeout=0.2")
    db.upgrade()
    writer = Writer(db)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        with pytest.raises(DatabaseUnavailableError, match="locked"):
            writer.write([snapshot("n", T0)])
        holder.execute("COMMIT")
    finally:
        holder.close()
    assert writer.write([snapshot("n", T0)]).gpu_rows == 2  # nothing was half-written by the failed attempt
    db.close()


def _assert_secret_absent(error: BaseException, caplog: pytest.LogCaptureFixture) -> None:
    text = "".join(traceback.format_exception(error))
    assert SECRET_PASSWORD not in text
    assert SECRET_PASSWORD not in repr(error)
    assert SECRET_PASSWORD not in caplog.text


def test_wrong_password_is_unavailable_and_never_shown(pg_server: PgServer, caplog: pytest.LogCaptureFixture) -> None:
    name = pg_server.create_database()
    wrong = SECRET_PASSWORD[::-1]
    db = Database(pg_server.url(name, user=SECRET_ROLE, password=wrong))
    caplog.set_level(logging.DEBUG)
    with pytest.raises(DatabaseUnavailableError, match="password authentication failed") as raised:
        db.upgrade()
    text = "".join(traceback.format_exception(raised.value))
    assert wrong not in text
    assert wrong not in caplog.text
    assert "***" in str(raised.value)
    db.close()
    pg_server.drop_database(name)


def test_postgresql_stopped_then_started(private_pg_server: PgServer, caplog: pytest.LogCaptureFixture) -> None:
    name = private_pg_server.create_database()
    db = Database(private_pg_server.url(name, user=SECRET_ROLE, password=SECRET_PASSWORD))
    caplog.set_level(logging.DEBUG)
    db.upgrade()
    writer = Writer(db)
    assert writer.write([snapshot("n", T0)]).gpu_rows == 2
    private_pg_server.stop()
    try:
        with pytest.raises(DatabaseUnavailableError) as write_error:
            writer.write([snapshot("n", T0 + 10)])
        with pytest.raises(DatabaseUnavailableError) as read_error:
            latest.latest_readings(db)
    finally:
        private_pg_server.start()
    _assert_secret_absent(write_error.value, caplog)
    _assert_secret_absent(read_error.value, caplog)
    assert "***" in str(write_error.value)
    # Back up: the failed round is written again (as the collector's spool replays it), exactly once.
    assert writer.write([snapshot("n", T0 + 10)]).gpu_rows == 2
    assert writer.write([snapshot("n", T0 + 10)]).gpu_rows == 0
    with db.session() as session:
        count = session.execute(sa.select(sa.func.count()).select_from(schema.gpu_sample)).scalar_one()
    assert count == 4
    assert SECRET_PASSWORD not in caplog.text
    db.close()
