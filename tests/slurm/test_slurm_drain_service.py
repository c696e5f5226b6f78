"""From a round with an XID 79 to a drained Slurm node: the alert engine, the outbox, the worker's action, the audit.

The collector's path as configured: ``[[alerts.actions]]`` parsed from TOML, the AlertService on a real SQLite
store, one delivery pass (what the notification worker runs) and the real scontrol.
"""

from __future__ import annotations

import dataclasses
import time
import tomllib
from pathlib import Path

from gpulens.alerts.config import parse_alerting
from gpulens.alerts.remediationcase import DRAINED, DRY_RUN
from gpulens.alerts.service import AlertService
from gpulens.model import NodeSnapshot, TargetHealth
from gpulens.rounds import RoundResult
from gpulens.storage.db import Database
from gpulens.storage.slurmtables import recent_drain_actions
from tests.fakes.static_source import node_snapshot
from tests.slurm.conftest import Slurm, wait_for


def xid_round(node: str, now: float, xids: dict[int, int]) -> RoundResult:
    base = node_snapshot(node, gpus=4, t=now)
    gpus = tuple(dataclasses.replace(g, xid_errors=xids if g.gpu == 3 else {}) for g in base.gpus)
    snapshot: NodeSnapshot = base.replace(gpus=gpus)
    target = TargetHealth(node, f"http://{node}", "gpulens", now, True, node=node)
    return RoundResult(time=now, snapshots=[snapshot], targets=[target], written=True)


def run_service(slurm: Slurm, tmp_path: Path, dry_run: bool) -> list[dict[str, object]]:
    db = Database(f"sqlite:///{tmp_path / 'gpulens.db'}")
    db.upgrade()
    text = f'[[alerts.actions]]\nkind = "slurm-drain"\ndry_run = {str(dry_run).lower()}\n'
    service = AlertService(db, parse_alerting(tomllib.loads(text)["alerts"]), notifiers={})
    try:
        now = time.time()
        service.hook(xid_round(slurm.host, now, {}))
        service.hook(xid_round(slurm.host, now + 10, {79: 1}))
        for _ in range(3):  # the worker's passes: the action's notification is due at once (group_wait 0)
            service.delivery.run_due(now + 10)
        return recent_drain_actions(db)
    finally:
        service.close()
        db.close()


def test_an_xid_79_round_drains_the_node(slurm: Slurm, tmp_path: Path) -> None:
    audit = run_service(slurm, tmp_path, dry_run=False)
    assert [(a["node"], a["gpu"], a["rule"], a["outcome"]) for a in audit] == [
        (slurm.host, "3", "XidError:79", DRAINED)
    ]
    wait_for(lambda: "drain" in slurm.node_state(), "the node to drain")
    reason = slurm.node_reason()
    # the incident's id and its culprit (an action acts on the verdict: alerts.remediationcase)
    assert reason.startswith("gpulens: inc-")
    assert reason.endswith(f" GPU {slurm.host}:3")


def test_a_dry_run_only_logs(slurm: Slurm, tmp_path: Path) -> None:
    audit = run_service(slurm, tmp_path, dry_run=True)
    assert [(a["rule"], a["outcome"]) for a in audit] == [("XidError:79", DRY_RUN)]
    assert "drain" not in slurm.node_state()
