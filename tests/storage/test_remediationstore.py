"""Remediation's memory in the store (revision 0018, ``storage.remediationstore``) on SQLite and PostgreSQL: the
upgrade from 0016 keeps the audit, the node-to-causes map, the cooldown row and the brake's halt."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from gpulens.alerts.remediationcase import DRY_RUN, DrainRecord
from gpulens.storage import remediationstore as store
from gpulens.storage.db import Database
from gpulens.storage.slurmtables import decisions_for, recent_drain_actions, record_drain_action
from tests.storage.conftest import T0
from tests.storage.data import downgrade

NEW_TABLES = {"remediation_node", "remediation_cause", "remediation_halt"}


@pytest.mark.empty_store
def test_0018_keeps_the_audit_rows_and_adds_remediations_tables(db_url: str) -> None:
    db = Database(db_url)
    db.upgrade("0016")
    with db.engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO drain_action (time, action, node, gpu, rule, outcome, reason) "
                "VALUES (:t, 'slurm-drain', 'n01', '3', 'XidError:79', 'drained', 'gpulens XidError 79')"
            ),
            {"t": T0},
        )
    db.upgrade()
    assert [(r["node"], r["outcome"], r["step"], r["causes"]) for r in recent_drain_actions(db)] == [
        ("n01", "drained", None, None)
    ]
    record_drain_action(db, DrainRecord(T0 + 1, "slurm-drain", "n02", "1", "GpuLost", DRY_RUN, "r", "drain", "fp2"))
    assert [r["node"] for r in decisions_for(db, "fp2")] == ["n02"]
    downgrade(db, "0016")
    with db.engine.connect() as conn:
        assert not NEW_TABLES & set(sa.inspect(conn).get_table_names())
        assert {c["name"] for c in sa.inspect(conn).get_columns("drain_action")} >= {"node", "outcome"}
    db.close()


def test_the_causes_the_cooldown_and_the_halt_are_kept(db: Database) -> None:
    hold = store.NodeHold("n01", "slurm-drain", "gpulens: fp1 gpu 3", T0, True, False)
    store.hold(db, hold, "fp1", "gpu 3")
    assert store.add_cause(db, "n01", "fp2", "slurm-drain", T0 + 1, "gpu 5")
    assert not store.add_cause(db, "n01", "fp2", "slurm-drain", T0 + 2, "gpu 5")  # a retry adds nothing
    assert store.drop_cause(db, "n01", "fp1") == ["fp2"]
    assert store.drop_cause(db, "n01", "fp1") is None
    assert store.drop_cause(db, "n01", "fp2") == []
    store.release(db, "n01")
    assert store.held_nodes(db) == {}
    kept = store.node_hold(db, "n01")
    assert kept is not None
    assert (kept.drained_at, kept.held) == (T0, False)  # the cooldown outlives the resume
    store.halt(db, T0 + 5, "11 of 100 nodes")
    store.halt(db, T0 + 6, "12 of 100 nodes")  # one halt at a time
    assert store.remediation_state(db)["halt"] == {"halted_at": T0 + 5, "reason": "11 of 100 nodes"}
    lifted = store.lift_halt(db, T0 + 7, "alice")
    assert lifted is not None
    assert store.current_halt(db) is None
    assert store.lift_halt(db, T0 + 8, "alice") is None
