"""A node's RAS answer counts for the whole job (``exporter.ncclwide``): in a 64-node job, where each node's turn would
come every 64 intervals and comes every 32 (``MAX_TURN_PERIOD``), the node that sees a new mismatch passes on the
other node's rank behind and confirms the mismatch with one query of its own ``MISMATCH_HOLD_S`` later; a mismatch
that moves (a straggler) costs one such query per turn and no more. Read over TCP from the simulator's RAS server."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from gpulens.clock import ManualClock
from gpulens.exporter.metrics import ExporterHealth, render_metrics
from gpulens.exporter.ncclras import NcclRasReader
from gpulens.exporter.sim.rasserver import RasServer, RasState, SimComm, SimRank
from gpulens.model import GpuJob, GpuReading, NodeSnapshot, ProcessReading
from gpulens.ncclmodel import MISMATCH_HOLD_S, RANK_DEAD, NcclView, is_remote

HOSTS = 64
START = 1000.0
STUCK = 77  # a rank on the 39th host: never this node's


def _state(lag: Callable[[float], int], clock: ManualClock, *, dead: bool = False) -> Callable[[], RasState]:
    def answer() -> RasState:
        ranks = [SimRank(r, f"10.0.0.{1 + r // 2}", 5000 + r, r % 2, {"AllReduce": 500}) for r in range(2 * HOSTS)]
        ranks[STUCK].counts["AllReduce"] = 500 - lag(clock.now())
        if dead and lag(clock.now()):
            ranks[STUCK].state = RANK_DEAD
        return RasState("2.28.7", [SimComm(0x27A079B828FF1A75, ranks)])

    return answer


def _snapshot() -> NodeSnapshot:
    node = "node-00"
    gpus = tuple(GpuReading(node, i, f"GPU-{node}-{i}", "H100", 0.0) for i in range(2))
    procs = tuple(ProcessReading(node, i, f"GPU-{node}-{i}", 5000 + i, job_id="big") for i in range(2))
    jobs = tuple(GpuJob(node, i, f"GPU-{node}-{i}", "big") for i in range(2))
    return NodeSnapshot(node, 0.0, "test", gpus=gpus, processes=procs, jobs=jobs)


def _run(lag: Callable[[float], int], seconds: int, dead: bool = False) -> tuple[list[float], dict[float, NcclView]]:
    """The times this node queried, and its view at each of them."""
    clock = ManualClock(START)
    server = RasServer(_state(lag, clock, dead=dead))
    reader = NcclRasReader(server.addr, clock=clock, background=False, interval_s=1.0)
    sent: list[float] = []
    views: dict[float, NcclView] = {}
    try:
        for _ in range(seconds):
            before = server.status_queries
            snap = reader.enrich(_snapshot())
            if server.status_queries > before:
                sent.append(clock.now())
                assert snap.nccl is not None
                views[clock.now()] = snap.nccl
            clock.advance(1.0)
    finally:
        server.close()
    return sent, views


def test_a_new_mismatch_is_confirmed_by_one_query_and_the_other_nodes_rank_passed_on() -> None:
    sent, views = _run(lambda t: 1 if t >= START + 5 else 0, 140)
    # the first query at once, its turns every 32 intervals (1024, 1056, ...), one follow-up MISMATCH_HOLD_S after
    # the turn that saw the new mismatch, none after the turns that see it held
    assert sent == [START, 1024.0, 1024.0 + MISMATCH_HOLD_S, 1056.0, 1088.0, 1120.0]
    confirmed = views[1024.0 + MISMATCH_HOLD_S]
    [comm] = confirmed.comms
    assert comm.mismatch_age_s == MISMATCH_HOLD_S
    [remote] = [r for r in confirmed.ranks if is_remote(r)]
    assert (remote.rank, remote.host, remote.gpu, remote.pid, remote.lag) == (STUCK, "10.0.0.39", 1, 5077, 1)
    assert {r.rank for r in confirmed.ranks if not is_remote(r)} == {0, 1}
    snap = _snapshot().replace(nccl=confirmed)
    families = {f.name: f for f in text_string_to_metric_families(render_metrics(snap, ExporterHealth()).decode())}
    lagging = [s for s in families["gpulens_nccl_rank_lag"].samples if s.labels["rank"] == str(STUCK)]
    assert [s.value for s in lagging] == [1.0]
    launched = families["gpulens_nccl_collective_launched"].samples
    assert {s.labels["rank"] for s in launched} == {"0", "1"}  # another node's counts are its own node's to export


def test_a_moving_mismatch_costs_one_follow_up_per_turn() -> None:
    sent, _ = _run(lambda t: 1 + int(t) % 3 if t >= START + 5 else 0, 200)
    turns = [1024.0 + 32 * i for i in range(6)]
    assert sent == [START, *sorted(turns + [t + MISMATCH_HOLD_S for t in turns[:-1]])]


def test_another_nodes_dead_rank_is_passed_on_at_this_nodes_turn() -> None:
    sent, views = _run(lambda t: 1 if t >= START + 5 else 0, 30, dead=True)
    assert sent == [START, 1024.0]
    [remote] = [r for r in views[1024.0].ranks if is_remote(r)]
    assert (remote.rank, remote.state, remote.lag) == (STUCK, RANK_DEAD, None)
