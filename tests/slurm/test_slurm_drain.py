"""The slurm-drain action against the real Slurm: an XID 79 drains the node with gpulens's own reason and resumes it
when it resolves; a host list drains nothing; a node drained by hand for maintenance keeps its state and reason
through every step; a dry run only records."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulens.alerts import remediationcase as rc
from gpulens.alerts.drain import DrainConfig, SlurmDrainer
from gpulens.alerts.state import FIRING, RESOLVED, AlertState
from gpulens.clock import ManualClock
from gpulens.storage.db import Database
from gpulens.storage.slurmtables import recent_drain_actions
from tests.dbtemplate import migrated_sqlite
from tests.slurm.conftest import Slurm, wait_for

START = 1_796_300_000.0  # 2026-12-03T12:13:20Z
LIVE = DrainConfig(dry_run=False, resume_on_resolve=True)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(migrated_sqlite(tmp_path / "gpulens.db"))  # a copy of one store migrated once
    yield database
    database.close()


def xid_alert(node: str, xid: str = "79", state: str = FIRING, gpu: str = "3") -> AlertState:
    labels = {"alertname": "XidError", "severity": "critical", "node": node, "gpu": gpu, "uuid": f"GPU-{gpu}"}
    labels["xid"] = xid
    return AlertState(
        fingerprint=f"xid-{xid}-{gpu}", rule="XidError", labels=labels, annotations={}, state=state,
        active_since=START,
    )  # fmt: skip


def outcomes(db: Database) -> list[tuple[str, str]]:
    return [(r["step"], r["outcome"]) for r in reversed(recent_drain_actions(db, limit=100))]


def test_an_xid_79_drains_the_node_with_its_own_reason_and_resumes_when_every_cause_resolved(
    slurm: Slurm, db: Database
) -> None:
    clock = ManualClock(START)
    drainer = SlurmDrainer(LIVE, db, clock=clock.now)
    drainer.send([xid_alert(slurm.host), xid_alert(slurm.host, gpu="5")], group_labels={}, status="firing")
    assert "drain" in slurm.node_state()
    assert slurm.node_reason() == "gpulens: xid-79-3 gpu 3 (GPU-3) XidError 79"

    clock.advance(60)
    restarted = SlurmDrainer(LIVE, db, clock=clock.now)  # a new process: only the store remembers
    restarted.send([xid_alert(slurm.host, state=RESOLVED)], group_labels={}, status="resolved")
    assert "drain" in slurm.node_state()  # GPU 5 still fires
    restarted.send([xid_alert(slurm.host, state=RESOLVED, gpu="5")], group_labels={}, status="resolved")
    wait_for(lambda: "drain" not in slurm.node_state(), "the node to be resumed")
    assert outcomes(db) == [
        (rc.DRAIN, rc.DRAINED),
        (rc.DRAIN, rc.JOINED),
        (rc.RESUME, rc.KEPT),
        (rc.RESUME, rc.RESUMED),
    ]


def test_a_host_list_drains_no_node_and_the_refusal_is_audited(slurm: Slurm, db: Database) -> None:
    drainer = SlurmDrainer(LIVE, db, clock=ManualClock(START).now)
    for name in (f"{slurm.host}[1-40]", f"{slurm.host},{slurm.host}", "n[01-40]"):
        drainer.send([xid_alert(name)], group_labels={}, status="firing")
    assert "drain" not in slurm.node_state()
    assert outcomes(db) == [(rc.DRAIN, rc.REFUSED_NODE_NAME)] * 3


def test_a_node_drained_by_hand_for_maintenance_keeps_its_state_and_reason(slurm: Slurm, db: Database) -> None:
    slurm.run("scontrol", "update", f"NodeName={slurm.host}", "State=DRAIN", "Reason=maintenance")
    wait_for(lambda: "drain" in slurm.node_state(), "the node to drain")
    clock = ManualClock(START)
    drainer = SlurmDrainer(LIVE, db, clock=clock.now)
    drainer.send([xid_alert(slurm.host)], group_labels={}, status="firing")
    clock.advance(7200)
    drainer.send([xid_alert(slurm.host, state=RESOLVED)], group_labels={}, status="resolved")
    drainer.send([xid_alert(slurm.host, gpu="1")], group_labels={}, status="firing")
    assert "drain" in slurm.node_state()
    assert slurm.node_reason() == "maintenance"
    assert outcomes(db) == [(rc.DRAIN, rc.LEFT_ALONE), (rc.DRAIN, rc.LEFT_ALONE)]
    assert "left alone: drained by someone else (maintenance)" in recent_drain_actions(db)[0]["reason"]


def test_a_node_taken_over_by_hand_after_gpulens_drained_it_is_not_resumed(slurm: Slurm, db: Database) -> None:
    drainer = SlurmDrainer(LIVE, db, clock=ManualClock(START).now)
    drainer.send([xid_alert(slurm.host)], group_labels={}, status="firing")
    slurm.run("scontrol", "update", f"NodeName={slurm.host}", "Reason=maintenance")
    drainer.send([xid_alert(slurm.host, state=RESOLVED)], group_labels={}, status="resolved")
    assert "drain" in slurm.node_state()
    assert slurm.node_reason() == "maintenance"
    assert outcomes(db)[-1] == (rc.RESUME, rc.LEFT_ALONE)


def test_a_dry_run_only_records(slurm: Slurm, db: Database) -> None:
    drainer = SlurmDrainer(DrainConfig(), db, clock=ManualClock(START).now)  # dry_run by default
    drainer.send([xid_alert(slurm.host), xid_alert(slurm.host, xid="13")], group_labels={}, status="firing")
    assert "drain" not in slurm.node_state()
    assert outcomes(db) == [(rc.DRAIN, rc.DRY_RUN)]  # XID 13 is not a listed rule
