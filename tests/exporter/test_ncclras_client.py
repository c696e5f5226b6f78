"""The RAS client against stand-in RAS servers of each NCCL generation and against hostile answers, and the node
agent's reader: ranks mapped to this node's GPUs and jobs, series capped, nodes of a job taking turns."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpulens.clock import ManualClock
from gpulens.exporter.metrics import ExporterHealth, render_metrics
from gpulens.exporter.ncclras import MAX_LOCAL_RANKS_PER_GPU, NcclRasReader
from gpulens.exporter.ncclrasclient import RasAnswer, RasQueryError, query_status
from gpulens.exporter.ncclrasparse import parse_report
from gpulens.exporter.sim.rasserver import RasServer, RasState, SimComm, SimRank
from gpulens.model import GpuJob, GpuReading, NodeSnapshot, ProcessReading
from gpulens.ncclmodel import RANK_DEAD, RANK_OK
from tests.exporter.test_metrics import promtool_check

Handler = Callable[[socket.socket], None]


@pytest.fixture
def hostile() -> Iterator[Callable[[Handler], str]]:
    """A TCP server on 127.0.0.1 whose every connection runs ``handler``: returns its address."""
    sockets: list[socket.socket] = []

    def start(handler: Handler) -> str:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        sockets.append(listener)

        def serve() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                sockets.append(conn)
                threading.Thread(target=handler, args=(conn,), daemon=True).start()

        threading.Thread(target=serve, daemon=True).start()
        return f"127.0.0.1:{listener.getsockname()[1]}"

    yield start
    for s in sockets:
        s.close()


def _job_state(version: str, *, lagging: int | None = None, dead: int | None = None) -> RasState:
    ranks = []
    for r in range(16):
        host = f"10.0.0.{1 + r // 8}"
        ranks.append(SimRank(r, host, 5000 + r, r % 8, {"AllReduce": 120, "AllGather": 30}))
    if lagging is not None:
        ranks[lagging].counts["AllReduce"] = 119
    if dead is not None:
        ranks[dead].state = RANK_DEAD
    return RasState(version, [SimComm(0x27A079B828FF1A75, ranks)])


@pytest.mark.parametrize(("version", "fmt"), [("2.24.3", "text"), ("2.26.2", "text"), ("2.28.7", "json")])
def test_each_generation_answers_in_its_format(version: str, fmt: str) -> None:
    server = RasServer(lambda: _job_state(version, lagging=3))
    try:
        answer = query_status(server.addr)
    finally:
        server.close()
    assert answer.format == fmt
    report = parse_report(answer.text)
    assert report.version == version
    [comm] = report.comms
    assert comm.ranks[3].pid == 5003
    assert server.status_queries == 1


def _snapshot(node: str, first_rank: int, job: str = "job-7") -> NodeSnapshot:
    gpus = tuple(GpuReading(node, i, f"GPU-{node}-{i}", "H100", 0.0) for i in range(8))
    procs = tuple(ProcessReading(node, i, f"GPU-{node}-{i}", 5000 + first_rank + i, job_id=job) for i in range(8))
    jobs = tuple(GpuJob(node, i, f"GPU-{node}-{i}", job) for i in range(8))
    return NodeSnapshot(node, 0.0, "test", gpus=gpus, processes=procs, jobs=jobs)


def test_reader_maps_this_nodes_ranks_to_gpu_job_and_state() -> None:
    server = RasServer(lambda: _job_state("2.28.7", lagging=9, dead=12))
    clock = ManualClock(1000.0)
    reader = NcclRasReader(server.addr, clock=clock, background=False)
    try:
        snap = reader.enrich(_snapshot("node-b", 8))
    finally:
        server.close()
    view = snap.nccl
    assert view is not None
    assert view.up
    assert view.format == "json"
    assert sorted(r.rank for r in view.ranks) == list(range(8, 16))  # only this node's ranks
    by_rank = {r.rank: r for r in view.ranks}
    assert by_rank[9].gpu_uuid == "GPU-node-b-1"
    assert by_rank[9].job_id == "job-7"
    assert by_rank[9].lag == 1
    assert by_rank[9].state == RANK_OK
    assert by_rank[12].state == RANK_DEAD
    [comm] = view.comms
    assert comm.status == "INCOMPLETE,MISMATCH"
    assert comm.collective == "AllReduce"
    assert comm.mismatch_age_s == 0.0
    text = render_metrics(snap, ExporterHealth()).decode()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"gpulens_nccl_ras_up", "gpulens_nccl_rank_lag", "gpulens_nccl_rank_dead"} <= names
    assert 'gpulens_nccl_rank_dead{node="node-b",job_id="job-7",comm="27a079b828ff1a75",rank="12"} 1' in text


def test_the_same_mismatch_ages_and_a_moving_one_does_not() -> None:
    state = {"lag": 119}

    def answer() -> RasState:
        s = _job_state("2.26.2", lagging=2)
        s.comms[0].ranks[2].counts["AllReduce"] = state["lag"]
        return s

    server = RasServer(answer)
    clock = ManualClock(1000.0)
    reader = NcclRasReader(server.addr, clock=clock, background=False, interval_s=1.0)
    ages = []
    try:
        for step in range(12):
            snap = reader.enrich(_snapshot("node-a", 0))
            assert snap.nccl is not None
            ages.append(snap.nccl.comms[0].mismatch_age_s)
            if step == 6:
                state["lag"] = 121  # the counts move on: another mismatch
            clock.advance(1.0)
    finally:
        server.close()
    assert max(a for a in ages[:7] if a is not None) > 0
    assert ages[7] == 0.0


def test_nodes_of_a_job_take_turns_one_query_per_interval() -> None:
    server = RasServer(lambda: _job_state("2.28.7"))
    clock = ManualClock(1000.0)
    readers = {n: NcclRasReader(server.addr, clock=clock, background=False) for n in ("node-a", "node-b")}
    snaps = {"node-a": _snapshot("node-a", 0), "node-b": _snapshot("node-b", 8)}
    per_interval = []
    try:
        for _ in range(40):
            before = server.status_queries
            for node, reader in readers.items():
                reader.enrich(snaps[node])
            per_interval.append(server.status_queries - before)
            clock.advance(1.0)
    finally:
        server.close()
    assert per_interval[0] == 2  # discovery: neither node knows the job's hosts yet
    assert max(per_interval[1:]) <= 1
    assert sum(per_interval[1:]) >= 30  # and each node still refreshes every other interval


def test_series_are_capped_to_this_nodes_room() -> None:
    def flood() -> RasState:
        ranks = [SimRank(r, "10.0.0.1", 5000, 0, {"AllReduce": 1}) for r in range(200)]
        return RasState("2.28.7", [SimComm(0x1, ranks)])

    server = RasServer(flood)
    reader = NcclRasReader(server.addr, clock=ManualClock(), background=False)
    try:
        snap = reader.enrich(_snapshot("node-a", 0))
    finally:
        server.close()
    assert snap.nccl is not None
    assert len(snap.nccl.ranks) == MAX_LOCAL_RANKS_PER_GPU * 8
    assert snap.errors["nccl_ras_ranks_cut"] == 1


def _handshake_then(conn: socket.socket, after: Callable[[socket.socket], None]) -> None:
    buffer = b""
    with conn:
        while buffer.count(b"\n") < 4:
            chunk = conn.recv(1024)
            if not chunk:
                return
            buffer += chunk
            if buffer.endswith(b"PROTOCOL 2\n"):
                conn.sendall(b"SERVER PROTOCOL 2\n")
            elif buffer.endswith(b"TIMEOUT 0\n"):
                conn.sendall(b"OK\n")
            elif buffer.endswith(b"json\n"):
                conn.sendall(b"ERROR: Unknown command SET FORMAT json\n")
        after(conn)


def test_a_huge_answer_is_cut(hostile: Callable[[Handler], str]) -> None:
    def huge(conn: socket.socket) -> None:
        try:
            while True:
                conn.sendall(b"x" * 65536)
        except OSError:
            return

    addr = hostile(lambda c: _handshake_then(c, huge))
    with pytest.raises(RasQueryError, match="more than 100000 bytes"):
        query_status(addr, timeout_s=0, grace_s=30, max_bytes=100_000)


def test_an_answer_that_never_ends_times_out(hostile: Callable[[Handler], str]) -> None:
    stop = threading.Event()

    def trickle(conn: socket.socket) -> None:
        conn.sendall(b"NCCL version 2.26.2\n")
        stop.wait(30)

    addr = hostile(lambda c: _handshake_then(c, trickle))
    try:
        with pytest.raises(RasQueryError, match="in time"):
            query_status(addr, timeout_s=0, grace_s=0.3)
    finally:
        stop.set()


@pytest.mark.parametrize(
    ("reply", "message"),
    [(b"HTTP/1.1 400 Bad Request\r\n\r\n", "not a RAS server"), (b"y" * 5000, "line over"), (b"", "closed")],
)
def test_a_server_that_is_not_ras(hostile: Callable[[Handler], str], reply: bytes, message: str) -> None:
    def answer(conn: socket.socket) -> None:
        with conn:
            conn.recv(1024)
            conn.sendall(reply)

    addr = hostile(answer)
    with pytest.raises(RasQueryError, match=message):
        query_status(addr, timeout_s=0, grace_s=5)


def test_a_malformed_report_is_counted_and_nothing_else_is_lost(hostile: Callable[[Handler], str]) -> None:
    addr = hostile(lambda c: _handshake_then(c, lambda conn: conn.sendall(b'{"communicators": [{"hash": 5}]}')))
    reader = NcclRasReader(addr, clock=ManualClock(), background=False, query=lambda: query_status(addr, timeout_s=0))
    snap = reader.enrich(_snapshot("node-a", 0))
    assert snap.nccl is not None
    assert not snap.nccl.up
    assert snap.errors["nccl_ras_malformed"] == 1
    assert len(snap.gpus) == 8


def test_nothing_listening_is_ras_down_not_an_exception() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    addr = f"127.0.0.1:{probe.getsockname()[1]}"
    probe.close()
    reader = NcclRasReader(addr, clock=ManualClock(), background=False)
    snap = reader.enrich(_snapshot("node-a", 0))
    assert snap.nccl is not None
    assert not snap.nccl.up
    assert "nothing listens" in (snap.nccl.error or "")
    assert not snap.errors  # GPU processes without NCCL's RAS are the usual case, not a collection error


def test_a_ras_that_does_not_answer_in_time_is_a_collection_error() -> None:
    reader = NcclRasReader(
        "127.0.0.1:1", clock=ManualClock(), background=False, query=lambda: _raise(RasQueryError("no answer in time"))
    )
    snap = reader.enrich(_snapshot("node-a", 0))
    assert snap.nccl is not None
    assert not snap.nccl.up
    assert snap.errors["nccl_ras_unreachable"] == 1


def _raise(exc: Exception) -> RasAnswer:
    raise exc


def test_promtool_accepts_the_nccl_families(promtool: str) -> None:
    server = RasServer(lambda: _job_state("2.28.7", lagging=3, dead=5))
    try:
        snap = NcclRasReader(server.addr, clock=ManualClock(), background=False).enrich(_snapshot("node-a", 0))
    finally:
        server.close()
    result = promtool_check(promtool, render_metrics(snap, ExporterHealth()))
    assert result.returncode == 0, result.stdout + result.stderr
