"""The incident layer judged in the simulator (``gpulens simulate``'s production path): each scenario's incidents
name the fault injected as their culprit, with the hurt jobs in their blast radius, and Slack gets one message per
incident from the real Slack notifier over HTTP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpulens.alerts.config import parse_alerting
from gpulens.alerts.incidentread import read_open_incidents
from gpulens.alerts.service import AlertService
from gpulens.cli.simulation import simulate
from gpulens.storage.connect import open_database
from gpulens.storage.inventory import gpu_info

from .incidentscenarios import (
    GPU_LOST_EXAMPLE,
    LINK_UNDER_TWO_JOBS,
    MEMORY_STARVED,
    TWO_FAULTS_ONE_JOB,
    XID_AFTER_STALL,
)
from .receivers import flaky_receiver, recording_receiver

RECEIVERS = {
    "receivers": [
        {"name": "chat", "kind": "slack", "url_env": "SLACK_URL"},
        {"name": "hook", "kind": "webhook", "url_env": "HOOK_URL"},
    ]
}


def test_a_gpu_off_the_bus_under_a_16_node_job_is_one_incident_and_one_slack_message(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sim.db'}"
    with recording_receiver() as (slack_url, slack), flaky_receiver([]) as (hook_url, hook):
        report = simulate(
            GPU_LOST_EXAMPLE,
            db_url=url,
            alerting=parse_alerting(RECEIVERS),
            environ={"SLACK_URL": slack_url, "HOOK_URL": hook_url},
        )
        messages = slack.all()
        hooks = [r for r in hook.accepted() if r.group_key.startswith("incident:")]
    fired = sorted(a["alertname"] for a in report.alerts)
    assert fired == ["CommunicationStall", "GpuLost", "XidError"]  # three alerts, each its own page before
    (incident,) = report.incidents
    assert incident["culprit"] == {
        "kind": "gpu",
        "node": "node-07",
        "gpu": 5,
        "uuid": incident["culprit"]["uuid"],
        "pci": incident["culprit"]["pci"],
        "device": None,
        "port": None,
        "job_id": None,
        "rank": None,
    }
    assert incident["culprit"]["uuid"].startswith("GPU-")
    assert incident["jobs"] == ["llm-pretrain"]
    assert incident["action"] == "reboot"  # XID 79's in the catalogue: drain the node
    assert sorted(a["alertname"] for a in incident["alerts"]) == fired
    assert incident["endsAt"] is None
    # one Slack message, naming the culprit, the job and its user, the action and the dashboard
    assert len(messages) == 1
    text = str(messages[0])
    for said in ("GPU node-07:5", "llm-pretrain", "alice", "reboot", "XID 79"):
        assert said in text
    assert len(hooks) == 1
    assert hooks[0].group_key == f"incident:{incident['id']}"
    # stored: a restarted (or failed-over) engine resumes the incident, already notified
    db = open_database(url)
    try:
        # the culprit's PCI address is its GPU's, as the store knows it (no alert of this incident carries one)
        (lost,) = gpu_info(db, uuids=[incident["culprit"]["uuid"]])
        assert incident["culprit"]["pci"] == lost.pci_bus_id
        assert lost.pci_bus_id
        assert lost.pci_bus_id.endswith(":00.0")
        (stored,) = read_open_incidents(db)
        assert stored.id == incident["id"]
        assert stored.notified is not None
        resumed = AlertService(db, parse_alerting(RECEIVERS), notifiers={}, load_at_first_round=False)
        assert set(resumed.engine.incidents) == {incident["id"]}
    finally:
        db.close()


def _run(tmp_path: Path, text: str) -> list[dict[str, Any]]:
    path = tmp_path / "scenario.toml"
    path.write_text(text)
    return simulate(path).incidents


def _culprit(incident: dict[str, Any]) -> tuple[Any, ...]:
    c = incident["culprit"]
    return (c["kind"], c["node"], c["gpu"], c["device"])


@pytest.mark.parametrize(
    ("scenario", "expected"),
    [
        # the stall fires first; the XID a round later re-attributes it: one incident, its culprit the GPU
        (XID_AFTER_STALL, [(("gpu", "node-01", 4, None), ["llm"], {"CommunicationStall", "XidError"})]),
        # one port under two jobs: both stalls are its incident
        (
            LINK_UNDER_TWO_JOBS,
            [(("port", "node-00", None, "mlx5_1"), ["a", "b"], {"IbLinkDown", "CommunicationStall"})],
        ),
        # two faults in one job: two incidents, each its own GPU, the job in both
        (
            TWO_FAULTS_ONE_JOB,
            [
                (("gpu", "node-00", 5, None), ["ft"], {"GpuThermalThrottling"}),
                (("gpu", "node-00", 2, None), ["ft"], {"XidError"}),
            ],
        ),
        # a node out of memory starves a job spanning it: the host alert explains the job's, the node is the culprit
        (
            MEMORY_STARVED,
            [(("node", "node-01", None, None), ["loader"], {"HostMemoryPressure", "JobInputBound"})],
        ),
    ],
    ids=["xid-after-stall", "link-under-two-jobs", "two-faults-one-job", "memory-starved"],
)
def test_overlapping_causes_each_name_their_culprit(
    tmp_path: Path, scenario: str, expected: list[tuple[tuple[Any, ...], list[str], set[str]]]
) -> None:
    incidents = _run(tmp_path, scenario)
    got = [(_culprit(i), i["jobs"], {a["alertname"] for a in i["alerts"]}) for i in incidents]
    assert got == expected
