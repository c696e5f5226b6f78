"""CommunicationStall from NCCL RAS through the simulator's RAS and the agents' real RAS readers: hangs with stuck
ranks fire ``rank_missing`` within 60 s naming the right ranks, a dead rank fires ``rank_dead`` within 90 s, hangs
without RAS keep the hardware signatures, and the confounders (checkpoints up to 15 minutes, evaluation phases, a
slow first step, stragglers, transient mismatches) stay silent."""

from __future__ import annotations

import pytest

from gpulens.alerts.catalogue import COMMUNICATION_STALL
from gpulens.exporter.sim import SimCluster, parse_scenario
from tests.alerts import ncclscenarios, scenarios
from tests.alerts.expect import run

RANK_MISSING_WITHIN_S = 60.0
RANK_DEAD_WITHIN_S = 90.0


def _stalls(outcome_fired: list, signature: str) -> list:  # type: ignore[type-arg]
    return [a for a in outcome_fired if a.alertname == COMMUNICATION_STALL and a.labels.get("signature") == signature]


@pytest.mark.parametrize("version", ["2.24.3", "2.26.2", "2.28.7"])
def test_hangs_with_stuck_ranks_and_a_dead_rank_are_named_in_time(version: str) -> None:
    text = scenarios.nccl_hangs(7, "H100-SXM5-80GB", 7, "two-node", version=version)
    outcome = run(text, f"nccl-{version}")
    assert not outcome.missed, outcome.describe()
    assert not outcome.false_alerts, outcome.describe()
    missing = _stalls(outcome.fired, "rank_missing")
    assert {a.labels["job_id"] for a in missing} == {"hang-spinning", "hang-blocked", "hang-mixed"}
    scenario = parse_scenario(text, source="nccl")
    hang_start = next(f.start for f in scenario.faults if f.kind == "hang_spinning")
    for alert in missing:
        assert alert.starts_at - hang_start <= RANK_MISSING_WITHIN_S
        job = next(j for j in scenario.jobs if j.id == alert.labels["job_id"])
        stuck = job.gpus[-1]
        assert f"{stuck.node} GPU {stuck.index}" in alert.annotations["stuck_ranks"]
        assert f"rank {len(job.gpus) - 1} " in alert.summary
        assert "AllReduce" in alert.summary or version < "2.26"
    [dead] = _stalls(outcome.fired, "rank_dead")
    assert dead.labels["job_id"] == "rank-dead"
    assert dead.starts_at - hang_start <= RANK_DEAD_WITHIN_S
    assert "rank 1 " in dead.annotations["stuck_ranks"]


def test_without_ras_the_hangs_keep_the_hardware_signatures() -> None:
    text = scenarios.nccl_hangs(7, "H100-SXM5-80GB", 7, "two-node", ras=False)
    outcome = run(text, "nccl-off")
    assert not outcome.missed, outcome.describe()
    assert not outcome.false_alerts, outcome.describe()
    signatures = {a.labels.get("signature") for a in outcome.fired if a.alertname == COMMUNICATION_STALL}
    assert signatures == {"spinning", "blocked", "mixed"}


@pytest.mark.parametrize("version", ["2.24.3", "2.28.7"])
def test_phases_and_confounders_raise_nothing_with_ras(version: str) -> None:
    text = scenarios.phases(4, "H100-SXM5-80GB", 11).replace("[[jobs]]", f'[[jobs]]\nnccl_version = "{version}"')
    outcome = run(text, f"phases-nccl-{version}")
    assert not outcome.false_alerts, outcome.describe()
    straggling = scenarios.job_faults(4, "H100-SXM5-80GB", 5, "two-node")
    outcome = run(straggling, "stragglers-nccl")
    assert not [a for a in outcome.false_alerts if a.labels.get("signature", "").startswith("rank_")]


def test_the_cluster_sends_at_most_two_status_queries_per_job_per_interval() -> None:
    """One in the job's turns, and now and then a node's follow-up confirming a mismatch it saw
    (``exporter.ncclwide``)."""
    text = scenarios.nccl_hangs(7, "H100-SXM5-80GB", 7, "two-node")
    scenario = parse_scenario(text, source="count")
    cluster = SimCluster(scenario)
    for k in range(int(scenario.duration_s / scenario.step_s)):
        for name in cluster.node_names():
            cluster.snapshot(name, scenario.start + k * scenario.step_s)
    queries = cluster.nccl.queries
    assert queries
    after_first = [n for (_, k), n in queries.items() if k > 0]  # after each agent's first query
    assert max(after_first) == 2
    assert sum(after_first) <= 1.5 * len(after_first)


@pytest.mark.parametrize("signature", ["rank_missing", "rank_dead"])
def test_a_sixteen_node_job_is_named_within_60_s(signature: str) -> None:
    """Each node's turn comes every 160 s here: the node that sees the fault names the other node's rank and
    confirms the mismatch itself (``exporter.ncclwide``)."""
    text = ncclscenarios.wide_job(16, signature)
    outcome = run(text, f"wide-{signature}")
    scenario = parse_scenario(text, source="wide")
    [fault] = scenario.faults
    [alert] = _stalls(outcome.fired, signature)
    assert alert.labels["job_id"] == ncclscenarios.JOB
    assert 0 <= alert.starts_at - fault.start <= RANK_MISSING_WITHIN_S
    assert "rank 31 " in alert.annotations["stuck_ranks"]
