"""``gpulens remediation list`` shows the brake, the nodes held and the decisions; ``resume`` lifts the halt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpulens.alerts.drain import DrainConfig, SlurmDrainer
from gpulens.cli.main import main
from gpulens.clock import ManualClock
from gpulens.storage import remediationstore as store
from gpulens.storage.db import Database
from tests.alerts.fakeslurm import FakeSlurm
from tests.alerts.test_remediation import T0, xid


def test_list_shows_the_halt_and_the_held_nodes_and_resume_lifts_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'gpulens.db'}"
    db = Database(url)
    db.upgrade()
    slurm, clock = FakeSlurm.of(10), ManualClock(T0)
    drainer = SlurmDrainer(DrainConfig(dry_run=False, max_drained_fraction=1.0), db, run=slurm, clock=clock.now)
    drainer.send([xid("n01"), xid("n02")], group_labels={}, status="firing")  # 10 % of 10 nodes is one: halted
    db.close()

    assert main(["remediation", "list", "--db", url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "2 of 10 nodes" in doc["halt"]["reason"]
    assert [(h["node"], [c["cause"] for c in h["causes"]]) for h in doc["held"]] == [("n01", ["fp-n01-3-79"])]
    assert [(d["node"], d["outcome"]) for d in doc["decisions"]] == [("n02", "refused-halted"), ("n01", "drained")]

    assert main(["remediation", "list", "--db", url]) == 0
    text = capsys.readouterr().out
    assert "brake: HALTED since" in text
    assert "gpulens remediation resume" in text

    assert main(["remediation", "resume", "--db", url, "--author", "alice"]) == 0
    assert "remediation resumed (halted since" in capsys.readouterr().out
    assert main(["remediation", "resume", "--db", url]) == 0
    assert capsys.readouterr().out == "remediation is not halted: nothing to lift\n"
    db = Database(url)
    assert store.current_halt(db) is None
    db.close()
