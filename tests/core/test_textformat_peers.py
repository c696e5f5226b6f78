"""The text format as gpulens's peers read it: every case of tests/fixtures/textformat/peer_cases.py through
``read_samples``, the samples, bad lines and an unused last line each as the case expects."""

from __future__ import annotations

import math

import pytest

from gpulens.promtext import LineStats, read_samples
from tests.fixtures.textformat.peer_cases import CASES, Case


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def test_the_peers_cases_are_many_and_from_every_peer() -> None:
    assert len(CASES) >= 100
    assert {case.source.split()[0] for case in CASES} == {
        "prometheus/prometheus",
        "prometheus/common",
        "prometheus/client_python",
    }


@pytest.mark.parametrize("case", CASES, ids=[f"{i}-{c.source.split()[0]}" for i, c in enumerate(CASES)])
def test_a_peer_case_reads_as_the_peers_majority_does(case: Case) -> None:
    stats = LineStats()
    read = [(s.name, s.labels, s.value, s.timestamp_ms) for s in read_samples(case.text, stats)]
    assert [(n, labels, ts) for n, labels, _, ts in read] == [(n, labels, ts) for n, labels, _, ts in case.samples]
    assert all(_same(got[2], want[2]) for got, want in zip(read, case.samples, strict=True))
    assert sum(stats.bad_reasons.values()) == case.bad, stats.bad_reasons
    assert stats.truncated == case.truncated
    assert stats.samples == len(case.samples)
