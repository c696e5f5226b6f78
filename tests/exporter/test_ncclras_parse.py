"""The RAS report reader against NCCL's own published samples (the user guide) and the simulator's RAS."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulens.exporter.ncclras import rank_lag, top_counts
from gpulens.exporter.ncclrasparse import ALL_COLLECTIVES, RasFormatError, pair_numbered, parse_report
from gpulens.exporter.sim.rasserver import RasState, SimComm, SimRank, render_json, render_text
from gpulens.ncclmodel import RANK_DEAD, RANK_MISSING, RANK_OK, RANK_UNRESPONSIVE

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ncclras"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_guide_transient_mismatch_names_the_six_ranks_one_behind() -> None:
    report = parse_report(fixture("guide_mismatch_warning.txt"))
    assert report.format == "text"
    [comm] = report.comms
    assert comm.comm == "27a079b828ff1a75"
    assert comm.size == 32
    assert comm.status == {"MISMATCH"}
    assert comm.majority == {ALL_COLLECTIVES: 6650}
    assert sorted(comm.ranks) == [0, 2, 3, 4, 5, 7]
    top = top_counts(comm)
    for r in comm.ranks.values():
        assert r.counts == {ALL_COLLECTIVES: 6649}
        assert rank_lag(r, top) == 1
        assert r.host == "172.16.64.210"
        assert r.nvml_dev == r.rank
        assert r.pid == 483072 + r.rank
    assert comm.ranks[7].pid == 483079


def test_guide_status_mismatch_carries_no_counts() -> None:
    report = parse_report(fixture("guide_status_mismatch.txt"))
    [comm] = report.comms
    assert comm.comm == "9e17999afaa87dbb"
    assert comm.status == {"MISMATCH"}
    assert all(not r.counts for r in comm.ranks.values())


def test_guide_incomplete_and_dead() -> None:
    incomplete = parse_report(fixture("guide_incomplete.txt"))
    [comm] = incomplete.comms
    assert (comm.ranks[21].state, comm.ranks[21].host) == (RANK_MISSING, None)  # what the answer says
    pair_numbered(incomplete)  # what the reader infers
    assert comm.comm == "cf264af53edbe986"
    assert comm.status == {"INCOMPLETE"}
    assert comm.size == 32
    assert incomplete.unresponsive == {("172.16.64.213", 3487984)}
    # 2.24 names the rank by number and the lost process apart: one of each, so they are paired
    missing = comm.ranks[21]
    assert (missing.state, missing.host, missing.pid, missing.nvml_dev) == (
        RANK_UNRESPONSIVE,
        "172.16.64.213",
        3487984,
        5,
    )
    dead = parse_report(fixture("guide_dead.txt"))
    pair_numbered(dead)
    assert dead.dead == {("172.16.64.213", 3487984)}
    assert dead.comms[0].ranks[21].state == RANK_DEAD


def test_guide_job_summary_gives_the_node_count() -> None:
    assert parse_report(fixture("guide_job_summary.txt")).nodes_total == 4


def test_guide_healthy_excerpts_parse_without_communicator_problems() -> None:
    for name in ("guide_job_summary.txt", "guide_communicators_ok.txt"):
        report = parse_report(fixture(name))
        assert report.comms == []
        assert not report.dead


def test_guide_json_2_29_1() -> None:
    report = parse_report(fixture("guide_2.29.1.json"))
    assert report.format == "json"
    assert report.version == "2.29.1"
    [comm] = report.comms
    assert comm.comm == "ae94423cfbb2ef4a"
    assert comm.size == 2
    assert comm.status == {"INCOMPLETE"}
    assert comm.ranks[0].state == RANK_OK
    assert comm.ranks[0].counts["AllReduce"] == 0
    assert comm.ranks[1].state == RANK_UNRESPONSIVE
    assert (comm.ranks[1].host, comm.ranks[1].pid, comm.ranks[1].nvml_dev) == ("172.16.64.245", 1524345, 1)


def _state(version: str) -> RasState:
    ranks = [SimRank(r, f"10.0.0.{1 + r // 4}", 1000 + r, r % 4, {"AllReduce": 50, "AllGather": 7}) for r in range(8)]
    ranks[5].counts["AllReduce"] = 49
    ranks[6].state = RANK_DEAD
    return RasState(version, [SimComm(0xABC, ranks)])


@pytest.mark.parametrize("version", ["2.24.3", "2.26.2", "2.28.7"])
def test_every_generation_names_the_lagging_rank_and_the_dead_one(version: str) -> None:
    state = _state(version)
    texts = [render_text(state)] + ([render_json(state)] if version >= "2.28.7" else [])
    for text in texts:
        report = parse_report(text)
        pair_numbered(report)
        [comm] = report.comms
        assert comm.comm == "0000000000000abc"
        assert "MISMATCH" in comm.status
        assert "INCOMPLETE" in comm.status
        lagging = comm.ranks[5]
        assert rank_lag(lagging, top_counts(comm)) == 1
        assert (lagging.host, lagging.pid, lagging.nvml_dev) == ("10.0.0.2", 1005, 1)
        assert comm.ranks[6].state == RANK_DEAD
        assert comm.ranks[6].pid == 1006
        collective = "AllReduce" if version >= "2.26" else ALL_COLLECTIVES
        assert collective in lagging.counts


@pytest.mark.parametrize(
    "text",
    [
        "",
        "hello\n",
        "{",
        "[1, 2]",
        '{"communicators": 5}',
        '{"communicators": [{"hash": "zz", "size": 2}]}',
        '{"communicators": [{"hash": "0x1", "size": -4}]}',
        '{"communicators": [{"hash": "0x1", "size": 2, "ranks": [{"rank": "a"}]}]}',
        '{"communicators": [{"hash": "0x1", "size": 2, "ranks": [{"rank": 0, "collective_counts": {"x y": 1}}]}]}',
        '{"communicators": [{"hash": "0x1", "size": 2, "ranks": [{"rank": 0, "collective_counts": {"A": 1e30}}]}]}',
        "[" * 100000,
    ],
)
def test_malformed_answers_raise_one_clear_error(text: str) -> None:
    with pytest.raises(RasFormatError) as caught:
        parse_report(text)
    assert "\n" not in str(caught.value)
