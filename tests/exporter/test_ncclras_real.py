"""The RAS report reader against the 45 answers NCCL's own report code prints (../shared/real/nccl-ras: five tags,
seven job situations, text and from 2.28.7 JSON), each read to exactly what its expect.json says."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpulens.exporter.ncclrasjson import repair
from gpulens.exporter.ncclrasparse import ALL_COLLECTIVES, RasReport, parse_report
from gpulens.ncclmodel import RANK_OK
from tests.realdata import real_folder

VERSIONS = ("2.24.3", "2.26.6", "2.27.7", "2.28.7", "2.30.7")
CASES = ("a-healthy", "b-one-behind", "c-dead", "d-multi", "e-hang-equal", "g-left-comm", "h-uneven")
JSON_CASES = ("a-healthy", "b-one-behind", "c-dead", "d-multi", "g-left-comm")
ANSWERS = [f"{v}/{c}.txt" for v in VERSIONS for c in CASES] + [
    f"{v}/{c}.json" for v in ("2.28.7", "2.30.7") for c in JSON_CASES
]


def answer(name: str) -> Path:
    return real_folder("nccl-ras") / name


def read(name: str) -> RasReport:
    return parse_report(answer(name).read_text())


def test_the_corpus_is_the_45_answers_listed_here() -> None:
    folder = real_folder("nccl-ras")
    found = sorted(
        str(p.relative_to(folder))
        for p in folder.glob("*/*")
        if p.suffix in (".txt", ".json") and not p.name.endswith(".expect.json")
    )
    assert found == sorted(ANSWERS)
    assert len(ANSWERS) == 45


def _collective(name: str) -> str:
    return "*" if name == ALL_COLLECTIVES else name


def what_it_reads(report: RasReport) -> list[dict[str, Any]]:
    """The report in expect.json's terms: per communicator, by hash, its size, status words (text), the ranks it
    names as missing, the counts it names (text: every count printed; JSON: those below the top of a collective
    whose counts differ) and the top count of each collective whose counts differ."""
    out = []
    for c in sorted(report.comms, key=lambda c: c.comm):
        differ = c.differing()
        bad = [
            {
                "rank": r.rank,
                "state": r.state,
                "host": r.host,
                "pid": r.pid,
                "cuda_dev": r.cuda_dev,
                "nvml_dev": r.nvml_dev,
            }
            for r in sorted(c.ranks.values(), key=lambda r: r.rank)
            if r.state != RANK_OK
        ]
        counts = sorted(
            (r.rank, _collective(name), count)
            for r in c.ranks.values()
            if r.state == RANK_OK
            for name, count in r.counts.items()
            if report.format == "text" or (name in differ and count < differ[name])
        )
        entry = {"hash": c.comm, "size": c.size, "bad_ranks": bad, "counts": counts}
        entry["top"] = {_collective(k): v for k, v in differ.items()}
        if report.format == "text":
            entry["status"] = sorted(c.status)
        out.append(entry)
    return out


@pytest.mark.parametrize("name", ANSWERS)
def test_each_real_answer_reads_as_its_expect_json_says(name: str) -> None:
    expect = json.loads(answer(name + ".expect.json").read_text())
    report = read(name)
    assert report.format == expect["format"]
    assert report.version == expect["version"]
    if expect["format"] == "text":
        assert report.nodes_total == expect["nodes_total"]
    got = what_it_reads(report)
    assert [c["hash"] for c in got] == [c["hash"] for c in expect["communicators"]]
    for mine, theirs in zip(got, expect["communicators"], strict=True):
        assert mine["size"] == theirs["size"], mine["hash"]
        if "status" in mine:
            assert mine["status"] == sorted(theirs["status"]), mine["hash"]
        assert len(mine["bad_ranks"]) == len(theirs["bad_ranks"]), mine["hash"]
        for bad, want in zip(mine["bad_ranks"], sorted(theirs["bad_ranks"], key=lambda b: b["rank"]), strict=True):
            assert bad["state"] in want["state"], (mine["hash"], bad)
            assert {k: v for k, v in bad.items() if k != "state"} == {k: v for k, v in want.items() if k != "state"}
        assert mine["counts"] == sorted((x["rank"], x["collective"], x["count"]) for x in theirs["counts"])
        assert mine["top"] == theirs["top"]


def standing_out(report: RasReport) -> dict[str, set[tuple[int, str, int]]]:
    """Per communicator, the ranks that stand out: each missing rank with its state, each rank behind with how far."""
    out: dict[str, set[tuple[int, str, int]]] = {}
    for c in report.comms:
        top = c.differing()
        ranks = out.setdefault(c.comm, set())
        for r in c.ranks.values():
            lag = max((top[n] - v for n, v in r.counts.items() if n in top), default=0)
            if r.state != RANK_OK or lag > 0:
                ranks.add((r.rank, r.state, lag))
    return out


@pytest.mark.parametrize("version", ["2.28.7", "2.30.7"])
@pytest.mark.parametrize("case", JSON_CASES)
def test_text_and_json_of_one_situation_give_the_same_ranks_and_states(version: str, case: str) -> None:
    text, doc = read(f"{version}/{case}.txt"), read(f"{version}/{case}.json")
    assert text.format == "text"
    assert doc.format == "json"
    named = standing_out(text)
    every = standing_out(doc)
    # Text names only the communicators where something stands out; JSON lists every one.
    assert named == {h: ranks for h, ranks in every.items() if ranks or h in named}
    assert text.timeouts in (None, doc.timeouts)


def test_2_28_7_json_is_not_json_as_nccl_prints_it_and_the_repair_adds_only_the_comma() -> None:
    raw = answer("2.28.7/d-multi.json").read_text()
    with pytest.raises(ValueError, match="delimiter"):
        json.loads(raw)
    fixed = repair(raw)
    assert len(fixed) == len(raw) + 1
    assert json.loads(fixed)["communicators"][2]["missing_ranks"][0]["nvml_dev"] == 5
    for valid in ("2.30.7/d-multi.json", "2.30.7/c-dead.json", "2.28.7/b-one-behind.json"):
        text = answer(valid).read_text()
        assert repair(text) == text


def test_an_uneven_job_counts_the_total_nodes_not_the_first_row() -> None:
    for version in VERSIONS:
        assert read(f"{version}/h-uneven.txt").nodes_total == 3


def test_timeouts_gathering_time_and_secondary_hash() -> None:
    for version in VERSIONS:
        text = read(f"{version}/d-multi.txt")
        assert text.timeouts == 1
        assert text.collection_s == (5.006 if version >= "2.28.7" else 5.01)  # " (%.3fs)" from 2.28.7
        assert read(f"{version}/a-healthy.txt").timeouts is None
    doc = read("2.30.7/d-multi.json")
    assert (doc.timeouts, doc.collection_s) == (1, 5.006)
    assert {c.comm: c.secondary for c in doc.comms}["d4e8a1b7c6f03952"] == "0x8a2f6d4c0e1b3975:0x6f1b7d9c3a4e5280"
    assert read("2.30.7/a-healthy.json").timeouts == 0


def test_asynchronous_errors_and_the_status_words() -> None:
    for version in VERSIONS:
        [comm] = read(f"{version}/c-dead.txt").comms
        assert comm.async_errors == 1
        assert comm.ranks[5].error == "Remote process error"
        assert comm.ranks[5].state == RANK_OK  # an error is not a missing rank
        abort = {c.comm: c for c in read(f"{version}/d-multi.txt").comms}["3a6f2c81d9e0b574"]
        assert (abort.ranks[1].status, abort.ranks[0].status) == ("ABORT", "RUNNING")
        left = read(f"{version}/g-left-comm.txt").comms[0].ranks[9]
        assert left.status == ("UNKNOWN" if version == "2.24.3" else "NOCOMM")
    for version in ("2.28.7", "2.30.7"):
        [comm] = read(f"{version}/c-dead.json").comms
        assert (comm.ranks[5].error, comm.ranks[5].init_state) == ("ncclRemoteError", 0)
        assert comm.ranks[4].error is None
        assert "ERROR" in comm.status


def test_2_30s_ncclTimeout_is_named_in_json() -> None:
    text = answer("2.30.7/c-dead.json").read_text().replace('"async_error": 6', '"async_error": 8')
    [comm] = parse_report(text).comms
    assert comm.ranks[5].error == "ncclTimeout"
