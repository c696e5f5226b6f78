"""Upgrading a store from the oldest revision, with data, on SQLite and PostgreSQL: the plan, the upgrade, the alerts,
the copies in batches.

A store at revision 0001 holds GPU samples and an alert that is firing. ``gpulens db upgrade --plan`` lists every
migration after it (read from the Alembic scripts, whatever they are), with the rows of the tables each touches and
the ones it copies on this backend, and changes nothing. The collector refuses to start on it without ``--migrate``,
in one line that says what to run. After the upgrade the samples read back, and the firing alert keeps its
fingerprint and its state: the engine's next round with the same condition fires nothing again.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from gpulens.alerts.base import AlertRule, Candidate
from gpulens.alerts.state import FIRING, AlertState, fingerprint, step
from gpulens.cli import main
from gpulens.storage import alertstore, latest, partitions
from gpulens.storage.connect import SchemaBehindError, ensure_schema
from gpulens.storage.db import Database
from gpulens.storage.migrations import tablecopy
from gpulens.storage.upgradeplan import plan, scripts
from tests.storage.conftest import T0

pytestmark = pytest.mark.empty_store

MINUTE0 = round(T0 - T0 % 3600) * 1000
SAMPLES = 3
RULE = AlertRule("GpuHot", "warning", for_s=0.0)
LABELS = {"alertname": "GpuHot", "severity": "warning", "node": "old-node", "gpu": "0", "uuid": "GPU-old"}
FIRED_AT = MINUTE0 / 1000 + 60


def _write_at_the_oldest_revision(db: Database, samples: int = SAMPLES, step_ms: int = 10_000) -> None:
    db.upgrade("0001")
    with db.engine.begin() as conn:
        if db.dialect == "postgresql":
            partitions.create_partition(conn, "gpu_sample", partitions.partition_start("gpu_sample", MINUTE0))
        conn.execute(
            sa.text(
                "INSERT INTO gpu (uuid, node, gpu_index, model, first_seen_ms, last_seen_ms) "
                "VALUES ('GPU-old', 'old-node', 0, 'NVIDIA H100 80GB HBM3', :t, :t)"
            ),
            {"t": MINUTE0},
        )
        gpu_id = conn.execute(sa.text("SELECT id FROM gpu")).scalar_one()
        for i in range(samples):
            conn.execute(
                sa.text(
                    "INSERT INTO gpu_sample (gpu_id, ts_ms, up, utilization_ratio, power_watts, temperature_celsius) "
                    "VALUES (:g, :t, 1, 7500, 3125, 455)"
                ),
                {"g": gpu_id, "t": MINUTE0 + step_ms * i},
            )
        state = sa.table(
            "alert_state",
            *(sa.column(c) for c in ("fingerprint", "rule", "state", "value", "active_at", "fired_at", "last_eval_at")),
            sa.column("labels", sa.JSON),
            sa.column("annotations", sa.JSON),
        )
        conn.execute(
            sa.insert(state).values(
                fingerprint=fingerprint(LABELS),
                rule="GpuHot",
                state="firing",
                labels=LABELS,
                annotations={"summary": "GPU 0 on old-node is hot"},
                value=91.0,
                active_at=FIRED_AT,
                fired_at=FIRED_AT,
                last_eval_at=FIRED_AT,
            )
        )


@pytest.fixture
def old(db_url: str) -> Iterator[Database]:
    """A store at revision 0001 with samples and a firing alert."""
    db = Database(db_url)
    try:
        _write_at_the_oldest_revision(db)
        yield db
    finally:
        db.close()


def test_the_plan_lists_every_migration_and_changes_nothing(
    old: Database, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db = old
    every = [s.revision for s in scripts().walk_revisions("base", "heads")][::-1]
    steps = plan(db)
    assert [s.revision for s in steps] == every[1:]
    by_revision = {s.revision: s for s in steps}
    assert by_revision["0003"].tables["gpu_sample"] == SAMPLES
    assert by_revision["0003"].copies == ()  # renames in place
    copying = {s.revision for s in steps if "gpu_sample" in s.copies}
    assert copying == ({"0004", "0007", "0008"} if db.dialect == "postgresql" else {"0008", "0010", "0011"})
    batched = {s.revision for s in steps if s.batched}  # copied into a new table in batches, swapped in at the end
    assert batched == ({"0007", "0008"} if db.dialect == "postgresql" else {"0008", "0010", "0011"})
    if db.dialect == "postgresql":
        assert by_revision["0004"].lock(db.dialect).startswith("ACCESS EXCLUSIVE on gpu_sample")  # in place
        assert by_revision["0008"].lock(db.dialect).startswith("ACCESS SHARE on gpu_sample while copied in batches")
    assert all(s.changes and "\n" not in s.changes for s in steps)
    assert all(s.reversible for s in steps)

    assert main(["db", "upgrade", "--plan", "--db", db_url]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith(f"at revision 0001; {len(every) - 1} migrations to {every[-1]}, oldest first")
    listed = [line.split()[0] for line in out[1:-1] if not line.startswith(" ")]
    assert listed == every[1:]
    assert out[-1].startswith(f"total: {sum(s.rows_copied for s in steps):,} rows copied")
    assert db.schema_revision() == "0001"  # the plan changed nothing


def test_the_collector_migrates_an_older_schema_only_when_told_to(old: Database) -> None:
    db = old
    with pytest.raises(SchemaBehindError) as refused:
        ensure_schema(db, migrate=False)
    (line,) = str(refused.value).splitlines()
    assert f"is at schema revision 0001 and this gpulens needs {db.head_revision()}" in line
    assert "gpulens db upgrade --plan" in line
    assert "--migrate" in line
    assert db.schema_revision() == "0001"
    ensure_schema(db, migrate=True)
    assert db.schema_revision() == db.head_revision()


def test_an_empty_database_gets_the_schema_without_migrate(db_url: str) -> None:
    db = Database(db_url)
    try:
        ensure_schema(db, migrate=False)
        assert db.schema_revision() == db.head_revision()
    finally:
        db.close()


def test_the_upgrade_keeps_the_samples_and_every_alerts_identity(old: Database) -> None:
    db = old
    db.upgrade()

    [reading] = latest.latest_readings(db)
    assert (reading.node, reading.gpu, reading.timestamp) == ("old-node", 0, (MINUTE0 + 20_000) / 1000)
    assert reading.power_watts == pytest.approx(312.5)

    [document] = alertstore.load_alert_states(db)
    state = AlertState.from_json(document)
    assert (state.fingerprint, state.state, state.fired_at) == (fingerprint(LABELS), FIRING, FIRED_AT)
    assert dict(state.labels) == LABELS
    # the engine's next round sees the same condition: the alert goes on firing, nothing is fired or notified again
    again = Candidate("GpuHot", dict(LABELS), 92.0, "GPU 0 on old-node is hot", "why")
    result = step({state.fingerprint: state}, [again], {"GpuHot": RULE}, FIRED_AT + 600)
    assert result.transitions == []
    assert result.states[state.fingerprint].state == FIRING
    assert result.states[state.fingerprint].fired_at == FIRED_AT


def test_db_downgrade_takes_the_schema_back_and_keeps_the_samples(
    old: Database, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    old.upgrade()
    head = old.head_revision()
    assert main(["db", "downgrade", "--to", "0011", "--db", db_url]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{db_url}: schema taken from revision {head} back to 0011"]
    assert old.schema_revision() == "0011"
    with old.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM gpu_sample")).scalar_one() == SAMPLES
    assert main(["db", "downgrade", "--to", "9999", "--db", db_url]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        "gpulens db downgrade: error: --to '9999': not a revision of this gpulens "
        "(gpulens db upgrade --plan lists them)"
    )
    assert main(["db", "upgrade", "--db", db_url]) == 0
    assert old.schema_revision() == head


def test_the_copies_run_in_batches_and_touch_the_live_table_only_at_the_swap(db_url: str) -> None:
    """Seven samples a minute apart, three rows a batch: each migration that copies gpu_sample copies it in three
    statements into a new table, and drops or renames the live table only after its last batch."""
    db = Database(db_url)
    statements: list[str] = []

    def record(conn: object, cursor: object, statement: str, *args: object) -> None:
        statements.append(" ".join(statement.split()))

    try:
        _write_at_the_oldest_revision(db, samples=7, step_ms=60_000)
        sa.event.listen(db.engine, "before_cursor_execute", record)
        before = tablecopy.BATCH_ROWS
        tablecopy.BATCH_ROWS = 3  # type: ignore[misc]
        try:
            db.upgrade()
        finally:
            tablecopy.BATCH_ROWS = before  # type: ignore[misc]
            sa.event.remove(db.engine, "before_cursor_execute", record)
        with db.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM gpu_sample")).scalar_one() == 7
    finally:
        db.close()
    new_tables = ("gpu_sample_rebuild", "gpu_sample_0008", "gpu_sample_0010", "gpu_sample_0011")
    batches = [i for i, s in enumerate(statements) if s.startswith("INSERT INTO gpu_sample_") and "SELECT" in s]
    by_table: dict[str, int] = {}
    for i in batches:
        table = statements[i].split()[2]
        assert table in new_tables
        by_table[table] = by_table.get(table, 0) + 1
    expected = {"gpu_sample_rebuild": 6} if db.dialect == "postgresql" else {t: 3 for t in new_tables[1:]}
    assert by_table == expected  # PostgreSQL: 0007 and 0008, three batches each
    # The live table is dropped or renamed only after the last batch of the copy that replaces it.
    swaps = [i for i, s in enumerate(statements) if s.startswith(("DROP TABLE gpu_sample", "ALTER TABLE gpu_sample "))]
    assert len(swaps) >= len(expected)
    for first, last in zip(batches[::3], batches[2::3], strict=True):
        assert not [i for i in swaps if first <= i <= last]


def test_an_empty_database_gets_its_schema_in_one_commit(db_url: str) -> None:
    """No reader sees half of a new schema."""
    db = Database(db_url)
    commits: list[object] = []
    try:
        sa.event.listen(db.engine, "commit", commits.append)
        db.upgrade()
    finally:
        db.close()
    assert len(commits) == 1


def test_an_older_store_commits_after_each_migration(old: Database) -> None:
    """The locks of one migration's swap end with it, not with the whole upgrade."""
    commits: list[object] = []
    sa.event.listen(old.engine, "commit", commits.append)
    pending = len(plan(old))
    old.upgrade()
    assert len(commits) == pending
