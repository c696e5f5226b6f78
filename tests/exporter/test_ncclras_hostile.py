"""Hostile RAS answers, served over TCP from a private port of 127.0.0.1 as a local process could: each is read
within its bounds (ranks read and kept, communicators and hosts remembered, mappings per answer), the exporter-side
process stays under 100 MB, and the next well-formed answer is read at the node's next turn."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpulens.clock import ManualClock
from gpulens.exporter import ncclras
from gpulens.exporter.metrics import ExporterHealth, render_metrics
from gpulens.exporter.ncclras import MAX_JOB_HOSTS, MAX_LOCAL_RANKS_PER_GPU, MAX_TURN_PERIOD, NcclRasReader
from gpulens.exporter.ncclrasparse import RasFormatError, parse_report
from gpulens.exporter.ncclrasreport import MAX_RANKS_READ
from gpulens.model import NodeSnapshot
from tests.exporter import rasanswers
from tests.exporter.rasanswers import JOB, AnswerServer, job_comm, json_answer, node_snapshot

WELL_FORMED = json_answer([job_comm(0xABC)])


@pytest.fixture
def serve() -> Iterator[list[AnswerServer]]:
    servers: list[AnswerServer] = []
    yield servers
    for s in servers:
        s.close()


def _server(servers: list[AnswerServer], answers: list[str]) -> AnswerServer:
    server = AnswerServer(answers)
    servers.append(server)
    return server


def _run_until_query(reader: NcclRasReader, clock: ManualClock, snap: NodeSnapshot, most: int) -> int:
    """Collections (one per interval) until the reader sends a query; how many intervals that took."""
    before = reader.queries
    for step in range(most):
        view = reader.enrich(snap).nccl
        if reader.queries > before:
            assert view is not None
            return step
        clock.advance(1.0)
    raise AssertionError(f"no query in {most} intervals")


def test_missing_rank_lines_are_capped_per_rank_not_per_line() -> None:
    text = rasanswers.missing_rank_lines(1_100_000)  # lines of 3,000 ranks, 1.1 million in all
    assert text.count("\n") < 500
    tracemalloc.start()
    try:
        with pytest.raises(RasFormatError, match=f"more than {MAX_RANKS_READ} ranks"):
            parse_report(text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20  # the ranks read before the cap are kept at most MAX_KEPT_RANKS


def test_after_a_rejected_answer_the_next_one_is_read_at_the_next_turn(serve: list[AnswerServer]) -> None:
    server = _server(serve, [rasanswers.missing_rank_lines(1_100_000), WELL_FORMED])
    clock = ManualClock(1000.0)
    reader = NcclRasReader(server.addr, clock=clock, background=False)
    snap = node_snapshot()
    view = reader.enrich(snap).nccl
    assert view is not None
    assert not view.up
    assert "ranks" in (view.error or "")
    assert _run_until_query(reader, clock, snap, 20) <= 10  # DISCOVER_EVERY: no host list learnt from it
    view = reader.enrich(snap).nccl
    assert view is not None
    assert view.up
    assert sorted(r.rank for r in view.ranks) == list(range(8))


def test_84000_ranks_on_this_node_are_refused_as_read(serve: list[AnswerServer]) -> None:
    answer = rasanswers.local_ranks(84_000)
    report = parse_report(answer, max_kept=200)  # no caller's node: every rank is read, 200 kept
    assert len(report.comms[0].ranks) == 200
    assert report.ranks_read == 84_000
    assert report.ranks_dropped == 84_000 - 200
    assert report.comms[0].top == {"AllReduce": 100}
    # For a node with room for 200 ranks, the answer is refused once it named 400 of them: the rest is not read.
    with pytest.raises(RasFormatError, match="more than 400 ranks on this node"):
        parse_report(answer, wanted=lambda host, pid: host == rasanswers.LOCAL_HOST, max_kept=200)
    server = _server(serve, [answer, rasanswers.local_ranks(200)])
    clock = ManualClock(1000.0)
    reader = NcclRasReader(server.addr, clock=clock, background=False)
    snap = node_snapshot()
    out = reader.enrich(snap)
    assert out.nccl is not None
    assert not out.nccl.up
    assert "ranks on this node" in (out.nccl.error or "")
    assert out.errors["nccl_ras_malformed"] == 1
    _run_until_query(reader, clock, snap, 20)  # the next answer, of 200 ranks here: cut to the node's room
    out = reader.enrich(snap)
    assert out.nccl is not None
    assert out.nccl.up
    assert len(out.nccl.ranks) == MAX_LOCAL_RANKS_PER_GPU * 8
    assert out.errors["nccl_ras_ranks_cut"] == 1


def test_an_answer_is_mapped_once_not_at_every_collection(
    serve: list[AnswerServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = _server(serve, [rasanswers.local_ranks(200)])
    mapped = []
    view_of = NcclRasReader._view
    monkeypatch.setattr(NcclRasReader, "_view", lambda self, *a: mapped.append(1) or view_of(self, *a))
    clock = ManualClock(1000.0)
    reader = NcclRasReader(server.addr, clock=clock, background=False, interval_s=1.0)
    snap = node_snapshot()
    for _ in range(30):
        view = reader.enrich(snap).nccl
        assert view is not None
        assert view.up
        clock.advance(1.0)
    assert server.status_queries >= 3
    assert len(mapped) == server.status_queries  # one mapping per answer, not one per collection (30)


def test_new_communicators_every_answer_leave_no_state_behind(serve: list[AnswerServer]) -> None:
    answers = [rasanswers.new_comms(4000, seed) for seed in range(6)]  # 100 of them with a rank here
    server = _server(serve, [*answers, WELL_FORMED])
    clock = ManualClock(1000.0)
    reader = NcclRasReader(server.addr, clock=clock, background=False)
    snap = node_snapshot()
    sizes = []
    tracemalloc.start()
    try:
        for _ in answers:
            _run_until_query(reader, clock, snap, 40)
            view = reader.enrich(snap).nccl
            assert view is not None
            assert view.up
            assert len(view.comms) == 100
            clock.advance(1.0)
            sizes.append(tracemalloc.get_traced_memory()[0])
            assert len(reader._mismatch_since) == 100  # only the last answer's communicators
    finally:
        tracemalloc.stop()
    assert sizes[-1] - sizes[1] < 1 << 20  # what is kept does not grow with the answers
    _run_until_query(reader, clock, snap, 40)
    view = reader.enrich(snap).nccl
    assert view is not None
    assert [c.comm for c in view.comms] == ["0000000000000abc"]
    assert len(reader._mismatch_since) <= 1


def test_4000_new_communicators_all_on_this_node_are_refused(serve: list[AnswerServer]) -> None:
    server = _server(serve, [rasanswers.new_comms(4000, 1, local=4000)])
    out = NcclRasReader(server.addr, clock=ManualClock(), background=False).enrich(node_snapshot())
    assert out.nccl is not None
    assert not out.nccl.up
    assert "more than 256 ranks on this node" in (out.nccl.error or "")


def test_state_of_a_job_gone_and_of_ranks_without_a_job_is_pruned(serve: list[AnswerServer]) -> None:
    server = _server(serve, [rasanswers.new_comms(50, 1)])
    clock = ManualClock(1000.0)
    reader = NcclRasReader(server.addr, clock=clock, background=False)
    reader.enrich(node_snapshot())
    assert reader._mismatch_since
    assert JOB in reader._seen_hosts
    other = node_snapshot()
    other = other.replace(
        processes=tuple(p.__class__(p.node, p.gpu, p.uuid, p.pid, job_id="job-8") for p in other.processes),
        jobs=(),
    )
    clock.advance(3600.0)  # a later answer, for another job
    _run_until_query(reader, clock, other, 40)
    assert JOB not in reader._seen_hosts
    assert JOB not in reader._hosts
    assert all(job == "job-8" for job, _ in reader._mismatch_since)


def test_20000_extra_hosts_do_not_push_the_next_query_away(serve: list[AnswerServer]) -> None:
    hostile = json_answer([job_comm(0xABC, extra_hosts=20_000)])
    server = _server(serve, [WELL_FORMED, hostile, hostile, WELL_FORMED])
    clock = ManualClock(1000.0)
    reader = NcclRasReader(server.addr, clock=clock, background=False)
    snap = node_snapshot()
    reader.enrich(snap)  # the first query: learns the job's two hosts
    assert reader._hosts[JOB] == ("10.0.0.1", "10.0.0.2")
    assert _run_until_query(reader, clock, snap, 3) <= 2  # the first hostile answer, at this node's turn
    # Its 20,000 hosts are cut to MAX_JOB_HOSTS, and this node's turn comes within MAX_TURN_PERIOD intervals.
    assert _run_until_query(reader, clock, snap, MAX_TURN_PERIOD + 1) <= MAX_TURN_PERIOD
    assert len(reader._hosts[JOB]) <= MAX_JOB_HOSTS
    assert "10.0.0.1" in reader._hosts[JOB]
    wait = _run_until_query(reader, clock, snap, MAX_TURN_PERIOD + 1)  # at most one turn period away
    assert wait <= MAX_TURN_PERIOD
    view = reader.enrich(snap).nccl
    assert view is not None
    assert view.up
    assert reader._hosts[JOB] == ("10.0.0.1", "10.0.0.2")  # the well-formed answer replaced the claimed hosts
    assert _run_until_query(reader, clock, snap, 3) <= 2


def test_one_hash_with_two_secondary_hashes_gives_two_communicators_and_no_duplicate_series(
    serve: list[AnswerServer],
) -> None:
    answer = json_answer(
        [job_comm(0xABC, secondary="0x1:0x2", count=10), job_comm(0xABC, secondary="0x3:0x4", count=20)]
    )
    doubled = json.loads(answer)
    doubled["communicators"].append(doubled["communicators"][0])  # and one named twice: read once
    report = parse_report(json.dumps(doubled))
    assert len(report.comms) == 2
    assert report.comms_duplicate == 1
    server = _server(serve, [answer])
    snap = NcclRasReader(server.addr, clock=ManualClock(), background=False).enrich(node_snapshot())
    assert snap.nccl is not None
    labels = sorted(c.comm for c in snap.nccl.comms)
    assert labels == ["0000000000000abc-1-2", "0000000000000abc-3-4"]
    series = [
        (s.name, tuple(sorted(s.labels.items())))
        for f in text_string_to_metric_families(render_metrics(snap, ExporterHealth()).decode())
        for s in f.samples
    ]
    assert len(series) == len(set(series))
    assert sum(1 for name, _ in series if name == "gpulens_nccl_collective_launched_total") == 16


# The peak resident memory of the child's own address space (VmHWM: ru_maxrss would carry the parent's over exec).
_CHILD = """
import json, sys
from gpulens.clock import ManualClock
from gpulens.exporter.ncclras import NcclRasReader
from tests.exporter.rasanswers import node_snapshot
clock = ManualClock(1000.0)
reader = NcclRasReader(sys.argv[1], clock=clock, background=False)
snap = node_snapshot()
seen = []
def peak():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
for step in range(int(sys.argv[2])):
    before = reader.queries
    view = reader.enrich(snap).nccl
    if reader.queries > before:
        seen.append([view.up, len(view.ranks), view.error, peak()])
    clock.advance(1.0)
print(json.dumps({"answers": seen, "peak_kib": peak()}))
"""


def test_every_hostile_answer_leaves_the_exporter_side_under_100_mb(serve: list[AnswerServer]) -> None:
    hostile = [
        rasanswers.missing_rank_lines(1_100_000),
        rasanswers.local_ranks(84_000),
        *(rasanswers.new_comms(4000, seed) for seed in range(3)),
        json_answer([job_comm(0xABC, extra_hosts=20_000)]),
        json_answer([job_comm(0xABC, secondary="0x1:0x2"), job_comm(0xABC, secondary="0x3:0x4")]),
    ]
    server = _server(serve, [*hostile, WELL_FORMED])
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, server.addr, str(12 * MAX_TURN_PERIOD)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=ncclras.__file__.rsplit("/gpulens/", 1)[0] if "/gpulens/" in ncclras.__file__ else None,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    result = json.loads(child.stdout)
    answers = result["answers"]
    assert len(answers) > len(hostile)
    assert answers[0][0] is False  # the over-long missing-rank list is refused
    assert answers[len(hostile)][:3] == [True, 8, None]  # the next well-formed answer is read whole
    assert result["peak_kib"] < 100 * 1024, answers


def test_json_of_endless_objects_is_refused_before_it_is_decoded() -> None:
    text = '{"communicators": [' + ",".join(["{}"] * 2_000_000) + "]}"  # 8 MiB of empty objects
    tracemalloc.start()
    try:
        with pytest.raises(RasFormatError, match="JSON objects and lists, more than"):
            parse_report(text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # counted, not decoded (decoded, 2 million dicts would hold over 100 MB)
