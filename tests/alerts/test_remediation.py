"""The remediation actions' safety, property by property, with a stand-in for Slurm's commands (``FakeSlurm``) and a
real SQLite store: names are names, only what is ours, the cap, the cooldown across a restart, resume when every
cause resolved, opt-out, the brake, retries, the verdict, requeue and the command action."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulens.alerts import remediationcase as rc
from gpulens.alerts.commandaction import CommandAction, CommandConfig
from gpulens.alerts.drain import DrainConfig, SlurmDrainer, remediation_line
from gpulens.alerts.notify import DeliveryError
from gpulens.alerts.notify.slack import SlackNotifier
from gpulens.alerts.state import FIRING, RESOLVED, AlertState
from gpulens.clock import ManualClock
from gpulens.storage import remediationstore as store
from gpulens.storage.db import Database
from gpulens.storage.slurmtables import decisions_for, recent_drain_actions
from tests.alerts.fakeslurm import FakeSlurm, Node
from tests.dbtemplate import migrated_sqlite

T0 = 1_796_300_000.0
# Live, resuming, and with the cap and the brake out of the way (their own tests set them).
LIVE = DrainConfig(dry_run=False, resume_on_resolve=True, max_drained_fraction=1.0, breaker_nodes=1.0)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(migrated_sqlite(tmp_path / "gpulens.db"))  # a copy of one store migrated once
    yield database
    database.close()


def xid(node: str, gpu: str = "3", code: str = "79", state: str = FIRING, job: str = "") -> AlertState:
    labels = {"alertname": "XidError", "severity": "critical", "node": node, "gpu": gpu, "uuid": f"GPU-{gpu}"}
    labels["xid"] = code
    if job:
        labels["job_id"] = job
    return AlertState(
        fingerprint=f"fp-{node}-{gpu}-{code}", rule="XidError", labels=labels, annotations={}, state=state,
        active_since=T0,
    )  # fmt: skip


def audit(db: Database) -> list[tuple[str, str, str]]:
    """(node, step, outcome) of every decision, oldest first."""
    return [(r["node"], r["step"], r["outcome"]) for r in reversed(recent_drain_actions(db, limit=1000))]


def drainer(db: Database, slurm: FakeSlurm, clock: ManualClock, config: DrainConfig = LIVE) -> SlurmDrainer:
    return SlurmDrainer(config, db, run=slurm, clock=clock.now)


def send(action: SlurmDrainer | CommandAction, *alerts: AlertState) -> None:
    action.send(list(alerts), group_labels={}, status=alerts[0].state)


@pytest.mark.parametrize("name", ["n[01-40]", "n01,n02", "n01 n02", "-n01", "n99", ""])
def test_a_name_that_is_not_exactly_one_known_node_drains_nothing_and_is_audited(db: Database, name: str) -> None:
    slurm = FakeSlurm.of(40)
    action = drainer(db, slurm, ManualClock(T0), DrainConfig(dry_run=False, max_drained_fraction=0.05))
    send(action, xid(name))
    assert slurm.updates() == []
    assert slurm.drained() == set()
    outcome = rc.REFUSED_NODE_NAME if name else rc.REFUSED_NO_NODE
    assert audit(db) == [(name, rc.DRAIN, outcome)]
    assert action.refusals[outcome] == 1


def test_drains_with_its_own_reason_and_resumes_only_when_every_cause_resolved(db: Database) -> None:
    slurm, clock = FakeSlurm.of(4), ManualClock(T0)
    action = drainer(db, slurm, clock)
    send(action, xid("n01", gpu="3"))
    send(action, xid("n01", gpu="5", code="48"))
    assert len(slurm.updates()) == 1  # drained once, the second GPU joins the first as a cause
    assert slurm.nodes["n01"].reason == "gpulens: fp-n01-3-79 gpu 3 (GPU-3) XidError 79"
    send(action, xid("n01", gpu="3", state=RESOLVED))
    assert slurm.drained() == {"n01"}  # GPU 5 still fires
    send(action, xid("n01", gpu="5", code="48", state=RESOLVED))
    assert slurm.drained() == set()
    assert audit(db) == [
        ("n01", rc.DRAIN, rc.DRAINED),
        ("n01", rc.DRAIN, rc.JOINED),
        ("n01", rc.RESUME, rc.KEPT),
        ("n01", rc.RESUME, rc.RESUMED),
    ]


def test_a_node_drained_or_down_for_someone_else_is_left_alone(db: Database) -> None:
    slurm, clock = FakeSlurm.of(4), ManualClock(T0)
    slurm.nodes["n01"] = Node("drained", "maintenance")
    slurm.nodes["n02"] = Node("down*", "not responding")
    action = drainer(db, slurm, clock)
    send(action, xid("n01"), xid("n02"))
    send(action, xid("n01", state=RESOLVED), xid("n02", state=RESOLVED))
    assert slurm.updates() == []
    assert (slurm.nodes["n01"].state, slurm.nodes["n01"].reason) == ("drained", "maintenance")
    assert [(n, o) for n, _, o in audit(db)] == [("n01", rc.LEFT_ALONE), ("n02", rc.LEFT_ALONE)]
    assert "drained by someone else (maintenance)" in recent_drain_actions(db)[-1]["reason"]


def test_a_node_taken_over_by_hand_after_the_drain_is_not_resumed(db: Database) -> None:
    slurm, clock = FakeSlurm.of(4), ManualClock(T0)
    action = drainer(db, slurm, clock)
    send(action, xid("n01"))
    slurm.nodes["n01"].reason = "maintenance"  # an operator keeps the node for repairs
    send(action, xid("n01", state=RESOLVED))
    assert (slurm.nodes["n01"].state, slurm.nodes["n01"].reason) == ("drained", "maintenance")
    assert audit(db)[-1] == ("n01", rc.RESUME, rc.LEFT_ALONE)
    assert store.held_nodes(db) == {}


def test_the_cap_counts_only_its_own_drains(db: Database) -> None:
    slurm, clock = FakeSlurm.of(128), ManualClock(T0)
    for i in range(1, 7):  # 6 of 128 drained by hand: 5 % would have blocked the old action
        slurm.nodes[f"n{i:02d}"] = Node("drained", "maintenance")
    action = drainer(db, slurm, clock, DrainConfig(dry_run=False, max_drained_fraction=0.05, breaker_nodes=1.0))
    send(action, *(xid(f"n{i:02d}") for i in range(10, 18)))  # 8 nodes; 5 % of 128 allows 6
    assert len(slurm.drained()) == 6 + 6
    assert [o for _, _, o in audit(db)].count(rc.REFUSED_FRACTION) == 2


def test_the_cooldown_outlives_a_restart(db: Database) -> None:
    slurm, clock = FakeSlurm.of(4), ManualClock(T0)
    send(drainer(db, slurm, clock), xid("n01"))
    send(drainer(db, slurm, clock), xid("n01", state=RESOLVED))  # a new process resumes it
    assert slurm.drained() == set()
    clock.advance(600)
    again = xid("n01", gpu="1")
    send(drainer(db, slurm, clock), again)  # a third process: within the hour, refused
    assert slurm.drained() == set()
    assert audit(db)[-1] == ("n01", rc.DRAIN, rc.REFUSED_COOLDOWN)
    clock.advance(3600)
    send(drainer(db, slurm, clock), again)
    assert slurm.drained() == {"n01"}


def test_a_restart_between_drain_and_resolve_resumes_when_the_last_cause_resolves(db: Database) -> None:
    slurm, clock = FakeSlurm.of(4), ManualClock(T0)
    send(drainer(db, slurm, clock), xid("n01", gpu="1"), xid("n01", gpu="2"))
    standby = drainer(db, slurm, clock)  # the first process is gone; nothing of it but the store
    send(standby, xid("n01", gpu="1", state=RESOLVED))
    assert slurm.drained() == {"n01"}
    send(standby, xid("n01", gpu="2", state=RESOLVED))
    assert slurm.drained() == set()


def test_opted_out_nodes_by_list_or_feature_are_never_drained(db: Database) -> None:
    slurm, clock = FakeSlurm.of(4), ManualClock(T0)
    slurm.nodes["n02"].features = ("gpu", "gpulens-keep")
    config = DrainConfig(
        dry_run=False,
        max_drained_fraction=1.0,
        breaker_nodes=1.0,
        exclude_nodes=("n01",),
        exclude_features=("gpulens-keep",),
    )
    send(drainer(db, slurm, clock, config), xid("n01"), xid("n02"), xid("n03"))
    assert slurm.drained() == {"n03"}
    assert [(n, o) for n, _, o in audit(db)][:2] == [("n01", rc.REFUSED_OPTED_OUT), ("n02", rc.REFUSED_OPTED_OUT)]


def test_a_retried_group_repeats_nothing_for_the_nodes_it_drained(db: Database) -> None:
    slurm, clock = FakeSlurm.of(8), ManualClock(T0)
    slurm.fail_for.add("n02")
    action = drainer(db, slurm, clock)
    group = [xid("n01"), xid("n02")]
    with pytest.raises(DeliveryError):
        send(action, *group)
    clock.advance(30)
    send(action, *group)  # the delivery stage's retry: the whole group again
    send(action, *group)
    assert slurm.drained() == {"n01", "n02"}
    assert audit(db) == [
        ("n01", rc.DRAIN, rc.DRAINED),
        ("n02", rc.DRAIN, rc.FAILED),
        ("n02", rc.DRAIN, rc.DRAINED),
    ]


def test_the_brake_halts_every_action_until_a_person_lifts_it(db: Database) -> None:
    slurm, clock = FakeSlurm.of(100), ManualClock(T0)
    action = drainer(db, slurm, clock, DrainConfig(dry_run=False, max_drained_fraction=0.05))
    for i in range(1, 31):  # XIDs on 30 % of the nodes within a minute
        clock.advance(2)
        send(action, xid(f"n{i:02d}"))
    assert len(slurm.drained()) == 5  # the cap
    outcomes = [o for _, _, o in audit(db)]
    assert outcomes[:10] == [rc.DRAINED] * 5 + [rc.REFUSED_FRACTION] * 5
    assert outcomes[10:] == [rc.REFUSED_HALTED] * 20  # the 11th of 100 nodes halts, and every later case
    halt = store.current_halt(db)
    assert halt is not None
    assert "11 of 100 nodes" in halt.reason
    config = CommandConfig("ticket", ("/bin/true",), ("XidError:79",), dry_run=False)
    command = CommandAction(config, db, run=slurm, clock=clock.now)
    send(command, xid("n50"))
    assert slurm.calls[-1][0] == "sinfo"  # the command did not run
    assert store.lift_halt(db, clock.now(), "ops") is not None
    clock.advance(3600)
    send(action, xid("n40"))
    assert audit(db)[-1] == ("n40", rc.DRAIN, rc.REFUSED_FRACTION)  # acting again (the cap still holds)


def test_an_application_verdict_never_drains(db: Database) -> None:
    slurm, clock = FakeSlurm.of(4), ManualClock(T0)
    config = DrainConfig(
        dry_run=False, max_drained_fraction=1.0, breaker_nodes=1.0, rules=("XidError:13", "XidError:79")
    )
    send(drainer(db, slurm, clock, config), xid("n01", code="13"))
    assert slurm.updates() == []
    assert audit(db) == [("n01", rc.DRAIN, rc.REFUSED_APPLICATION)]


def test_requeue_is_off_by_default_and_requeues_the_blast_radius_when_on(db: Database) -> None:
    slurm, clock = FakeSlurm.of(4), ManualClock(T0)
    send(drainer(db, slurm, clock), xid("n01", job="4242"))
    assert not [c for c in slurm.calls if c[1:2] == ["requeue"]]
    config = DrainConfig(dry_run=False, max_drained_fraction=1.0, breaker_nodes=1.0, requeue=True)
    send(drainer(db, slurm, clock, config), xid("n02", job="4343"), xid("n03", job="12,13"))
    assert [c for c in slurm.calls if c[1:2] == ["requeue"]] == [["scontrol", "requeue", "4343"]]
    assert ("n02", rc.REQUEUE, rc.REQUEUED) in audit(db)


def test_a_dry_run_runs_nothing_and_records_what_it_would_do(db: Database) -> None:
    slurm, clock = FakeSlurm.of(4), ManualClock(T0)
    action = drainer(db, slurm, clock, DrainConfig(resume_on_resolve=True, max_drained_fraction=1.0, breaker_nodes=1.0))
    send(action, xid("n01"))
    send(action, xid("n01", state=RESOLVED))
    assert slurm.updates() == []
    assert audit(db) == [("n01", rc.DRAIN, rc.DRY_RUN), ("n01", rc.RESUME, rc.DRY_RUN)]


def test_the_command_action_passes_the_verdict_as_arguments_never_through_a_shell(db: Database) -> None:
    ran: list[list[str]] = []
    config = CommandConfig("ticket", ("/usr/local/sbin/ticket", "--queue", "hw"), ("XidError:79",), dry_run=False)
    command = CommandAction(config, db, run=lambda argv, timeout: ran.append(list(argv)) or "", clock=lambda: T0)
    send(command, xid("n01; rm -rf /"), xid("n01", job="77"))
    assert len(ran) == 1
    assert ran[0][:3] == ["/usr/local/sbin/ticket", "--queue", "hw"]
    args = dict(zip(ran[0][3::2], ran[0][4::2], strict=True))
    assert (args["--node"], args["--action"], args["--jobs"]) == ("n01", "reboot", "77")
    assert (args["--state"], args["--case"]) == ("firing", "fp-n01-3-79")
    assert [o for _, _, o in audit(db)] == [rc.REFUSED_NODE_NAME, rc.RAN]


def test_a_slack_message_says_what_remediation_did_about_the_alert(db: Database) -> None:
    slurm, clock = FakeSlurm.of(4), ManualClock(T0)
    send(drainer(db, slurm, clock), xid("n01"), xid("n[01-04]"))
    slack = SlackNotifier(
        "https://hooks.example/x", remediation=lambda a: remediation_line(decisions_for(db, a.fingerprint))
    )
    message = json.dumps(slack.render([xid("n01"), xid("n[01-04]")], group_labels={}, status=FIRING))
    assert "*Done:* slurm-drain drained n01" in message
    assert "*Done:* slurm-drain refused-node-name n[01-04]: node 'n[01-04]' is not" in message


def test_a_dry_run_forgets_a_node_once_its_causes_resolved_so_its_cap_does_not_fill(db: Database) -> None:
    slurm, clock = FakeSlurm.of(4), ManualClock(T0)
    action = drainer(db, slurm, clock, DrainConfig(max_drained_fraction=0.25, breaker_nodes=1.0))  # one node
    send(action, xid("n01"))
    send(action, xid("n01", state=RESOLVED))
    send(action, xid("n02"))
    assert [o for _, _, o in audit(db)] == [rc.DRY_RUN, rc.DRY_RUN, rc.DRY_RUN]
    assert set(store.held_nodes(db)) == {"n02"}
