"""The slurm-drain action against the real Slurm: an XID 79 drains the node, or only logs in a dry run."""

from __future__ import annotations

from gpulens.alerts.drain import DRAINED, DRY_RUN, REFUSED_COOLDOWN, RESUMED, DrainConfig, DrainRecord, SlurmDrainer
from gpulens.alerts.state import FIRING, RESOLVED, AlertState
from gpulens.clock import ManualClock
from tests.slurm.conftest import Slurm, wait_for

START = 1_796_300_000.0  # 2026-12-03T12:13:20Z


def xid_alert(node: str, xid: str = "79", state: str = FIRING) -> AlertState:
    labels = {"alertname": "XidError", "severity": "critical", "node": node, "gpu": "3", "uuid": "GPU-3", "xid": xid}
    return AlertState(
        fingerprint=f"xid-{xid}", rule="XidError", labels=labels, annotations={}, state=state, active_since=START
    )


def test_an_xid_79_drains_the_node_with_a_reason_naming_alert_gpu_and_time(slurm: Slurm) -> None:
    audit: list[DrainRecord] = []
    clock = ManualClock(START)
    drainer = SlurmDrainer(DrainConfig(dry_run=False, resume_on_resolve=True), audit=audit.append, clock=clock.now)
    drainer.send([xid_alert(slurm.host)], group_labels={}, status="firing")
    assert "drain" in slurm.node_state()
    assert slurm.node_reason() == "gpulens XidError 79 on GPU 3 (GPU-3) at 2026-12-03T12:13:20Z"
    assert [(r.node, r.rule, r.outcome) for r in audit] == [(slurm.host, "XidError:79", DRAINED)]

    clock.advance(60)  # within the cooldown: refused and recorded
    drainer.send([xid_alert(slurm.host)], group_labels={}, status="firing")
    assert audit[-1].outcome == REFUSED_COOLDOWN

    drainer.send([xid_alert(slurm.host, state=RESOLVED)], group_labels={}, status="resolved")
    wait_for(lambda: "drain" not in slurm.node_state(), "the node to be resumed")
    assert audit[-1].outcome == RESUMED


def test_a_dry_run_only_logs_and_records(slurm: Slurm) -> None:
    audit: list[DrainRecord] = []
    drainer = SlurmDrainer(DrainConfig(), audit=audit.append, clock=ManualClock(START).now)  # dry_run by default
    drainer.send([xid_alert(slurm.host), xid_alert(slurm.host, xid="13")], group_labels={}, status="firing")
    assert "drain" not in slurm.node_state()
    assert [(r.rule, r.outcome) for r in audit] == [("XidError:79", DRY_RUN)]  # XID 13 is not a listed rule
