"""The text reader skims what the caller cannot keep (``ncclrasparse._Skimmer``): a communicator block holding none of
this node's ranks is counted, not read, and a run of other nodes' ranks past those kept is searched for this node's
lines. The report is the one reading every line gives (but the hosts of the ranks skimmed), for NCCL's own answers
and for hostile ones; the work is bounded by the lines read, not the lines sent."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpulens.exporter import ncclrasparse
from gpulens.exporter.ncclrasparse import RasReport, parse_report
from gpulens.exporter.ncclrasreport import MAX_OTHER_RANKS, LocalProcesses
from tests.exporter import rasanswers
from tests.exporter.test_ncclras_real import ANSWERS, answer


def _kept(report: RasReport, *, hosts: bool = True) -> list[tuple[object, ...]]:
    return sorted(
        (c.comm, c.size, sorted(c.status), dict(c.top), dict(c.low), c.ranks_read, repr(c.ranks))
        + ((sorted(c.hosts),) if hosts else ())
        for c in report.comms
    )


def _both(text: str, local: LocalProcesses) -> tuple[RasReport, RasReport]:
    def plain(host: str | None, pid: int | None) -> bool:  # the same choice, as a callable the reader cannot search
        return local(host, pid)

    kw = {"max_kept": 128, "max_others": MAX_OTHER_RANKS}
    return parse_report(text, wanted=local, **kw), parse_report(text, wanted=plain, **kw)  # type: ignore[arg-type]


def _hosts(text: str) -> Iterator[LocalProcesses]:
    everyone = parse_report(text)
    hosts = {r.host for c in everyone.comms for r in c.ranks.values() if r.host}
    for host in sorted(hosts):
        pids = {r.pid for c in everyone.comms for r in c.ranks.values() if r.host == host and r.pid is not None}
        yield LocalProcesses(frozenset({host}), frozenset(pids))


@pytest.mark.parametrize("name", [a for a in ANSWERS if a.endswith(".txt")])
def test_nccls_own_answers_read_the_same_skimmed(name: str) -> None:
    text = answer(name).read_text()
    for local in [LocalProcesses(frozenset({"192.0.2.1"}), frozenset({1})), *_hosts(text)]:
        skimmed, read = _both(text, local)
        assert _kept(skimmed) == _kept(read), local
        assert (skimmed.ranks_read, skimmed.dead, skimmed.nodes_total) == (read.ranks_read, read.dead, read.nodes_total)


LOCAL = rasanswers.local_processes()


@pytest.fixture
def lines_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many lines the text reader reads one by one, per parse."""
    counted = [0]
    line = ncclrasparse._TextReader.line

    def counting(self: ncclrasparse._TextReader, text: str) -> None:
        counted[0] += 1
        line(self, text)

    monkeypatch.setattr(ncclrasparse._TextReader, "line", counting)
    return counted


def test_a_block_of_other_nodes_ranks_is_counted_not_read(lines_read: list[int]) -> None:
    text = rasanswers.other_node_ranks(86_000)
    skimmed, read = _both(text, LOCAL)
    assert skimmed.comms == read.comms == []  # no rank of this node: nothing kept, as before
    assert skimmed.ranks_read == read.ranks_read == 86_000
    lines_read[0] = 0
    parse_report(text, wanted=LOCAL, max_kept=128, max_others=MAX_OTHER_RANKS)
    assert lines_read[0] < 40  # the heading lines; none of the 86,000 rank lines


def test_this_nodes_line_among_other_nodes_ranks_is_found(lines_read: list[int]) -> None:
    """Rank 60,000 is this node's; rank 70,000, past the other ranks kept, reached the top count: both are read."""
    text = rasanswers.other_node_ranks(86_000, mine_at=60_000, top_at=70_000)
    skimmed, read = _both(text, LOCAL)
    [comm] = skimmed.comms
    assert comm.ranks[60_000].counts == {"AllReduce": 99}
    assert comm.top["AllReduce"] == 250
    assert comm.low["AllReduce"] == 99
    assert _kept(skimmed, hosts=False) == _kept(read, hosts=False)
    # the hosts of the ranks skimmed are not noted (this node's line is read: its host is)
    assert comm.hosts - {rasanswers.LOCAL_HOST} < read.comms[0].hosts
    assert skimmed.ranks_read == read.ranks_read
    lines_read[0] = 0
    parse_report(text, wanted=LOCAL, max_kept=128, max_others=MAX_OTHER_RANKS)
    assert lines_read[0] < MAX_OTHER_RANKS + 40  # the other ranks kept, then this node's line alone


def test_a_skimmed_answer_past_the_rank_cap_is_refused() -> None:
    with pytest.raises(ncclrasparse.RasFormatError, match="more than 131072 ranks"):
        parse_report(rasanswers.other_node_ranks(140_000), wanted=LOCAL, max_kept=128, max_others=MAX_OTHER_RANKS)
