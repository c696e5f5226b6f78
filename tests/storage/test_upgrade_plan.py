"""Upgrading a store from the oldest revision, with data, on SQLite and PostgreSQL: the plan, the upgrade, the alerts.

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
from gpulens.storage.upgradeplan import plan, scripts
from tests.storage.conftest import T0

pytestmark = pytest.mark.empty_store

MINUTE0 = round(T0 - T0 % 3600) * 1000
SAMPLES = 3
RULE = AlertRule("GpuHot", "warning", for_s=0.0)
LABELS = {"alertname": "GpuHot", "severity": "warning", "node": "old-node", "gpu": "0", "uuid": "GPU-old"}
FIRED_AT = MINUTE0 / 1000 + 60


def _write_at_the_oldest_revision(db: Database) -> None:
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
        for i in range(SAMPLES):
            conn.execute(
                sa.text(
                    "INSERT INTO gpu_sample (gpu_id, ts_ms, up, utilization_ratio, power_watts, temperature_celsius) "
                    "VALUES (:g, :t, 1, 7500, 3125, 455)"
                ),
                {"g": gpu_id, "t": MINUTE0 + 10_000 * i},
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
