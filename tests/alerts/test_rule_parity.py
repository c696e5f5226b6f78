"""One rule means the same wherever it runs: over each example scenario (faults, hangs with two ranks stuck for NCCL RAS
to name, fabric, confounders) the alert engine over SQL (``gpulens simulate``), the same engine over Prometheus
(``gpulens alerts run --db prometheus+...``) and Prometheus evaluating ``gpulens rules export --format prometheus``
raise the same alerts, each beginning to fire within two evaluation intervals of the others
(``tests/alerts/ruleparity.py`` says how alerts are told apart and compared). Rules the export cannot say in PromQL
(gpulens-only in the catalogue, ``GPULENS_ONLY``) are compared between the two engines only.

One Prometheus serves every scenario's history (the exporter's own pages every 10 s, written as TSDB blocks, each
scenario four hours after the previous one). Backfilled blocks carry no staleness markers, so Prometheus runs with a
30 s lookback instead of 5 minutes: a series that leaves a page, or a node that stops answering, is gone 30 s later,
as the markers of a scraping Prometheus would make it.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

from gpulens.alerts.catalogue import GPULENS_ONLY
from gpulens.alerts.promexport import prometheus_rules
from gpulens.alerts.rules import builtin_rules
from gpulens.exporter.sim import parse_scenario
from gpulens.settings import StoreAuth
from gpulens.storage.prometheus.client import PromClient
from tests.alerts import ruleparity as rp
from tests.prom import running_prometheus
from tests.storage.promblocks import blocks_from_openmetrics, scenario_openmetrics

# What a way cannot raise, by (way, subject: the rule, or the rule and signature of a stall), and why. A difference
# is known when every way that did not raise the alert is listed here for its subject; an entry no difference needs
# fails the last test, so the list stays empty while the three ways agree.
CANNOT: Final[dict[tuple[str, str], str]] = {}


# What a way raises instead, by (way, subject), and why: a difference is also known when every way that raised the
# alert is listed here for its subject.
INSTEAD: Final[dict[tuple[str, str], str]] = {}


def _subject(key: rp.Identity) -> str:
    return f"{key[0]} {key[2]}" if key[0] == "CommunicationStall" else key[0]


def _known(difference: rp.Difference) -> bool:
    subject = _subject(difference.key)
    if not difference.missing:
        return False
    return all((way, subject) in CANNOT for way in difference.missing) or all(
        (way, subject) in INSTEAD for way in difference.onsets
    )


@dataclass
class Outcome:
    ways: dict[str, rp.Onsets]
    end: float
    refused: list[str]


def _simulate_all() -> dict[str, rp.Onsets]:
    return {name: rp.sql_onsets(name) for name in rp.SCENARIOS}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory, prometheus_bin: str, promtool: str) -> dict[str, Outcome]:
    work = tmp_path_factory.mktemp("ruleparity")
    rules = builtin_rules()
    exported = rp.exported_rules(prometheus_rules(rules))
    scopes = {rule.name: rule.scope for rule in rules}
    only = {
        "sql": frozenset(scopes),
        "engine": frozenset(scopes),
        "promql": frozenset(r["alert"] for r in exported),
    }
    assert not only["promql"] & set(GPULENS_ONLY)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        simulated = pool.submit(_simulate_all)  # the SQL way beside the history's writing
        source = work / "history.om"
        texts = {name: rp.scenario_text(name) for name in rp.SCENARIOS}
        with source.open("w") as out:
            for i, text in enumerate(texts.values()):
                out.writelines(scenario_openmetrics(text, i * rp.SPACING_S, rp.STEP_S, leave_out=rp.UNREAD))
            out.write("# EOF\n")
        blocks_from_openmetrics(promtool, source, work / "tsdb")
        source.unlink()
        flags = ("--storage.tsdb.retention.time=100y", "--query.lookback-delta=30s")
        result: dict[str, Outcome] = {}
        with running_prometheus(prometheus_bin, Path(work), {}, flags=flags) as base, ThreadPoolExecutor(1) as threads:
            client = PromClient("prometheus+" + base, StoreAuth(min_step_s=rp.STEP_S), environ={})
            try:
                for i, (name, text) in enumerate(texts.items()):
                    scenario = parse_scenario(text)
                    offset = i * rp.SPACING_S
                    promql = threads.submit(
                        rp.promql_onsets, client, exported, scopes, scenario.start, scenario.end, offset
                    )
                    engine = rp.engine_onsets(base, rules, scenario.start, scenario.end, offset)
                    onsets, refused = promql.result()
                    result[name] = Outcome({"engine": engine, "promql": onsets}, scenario.end - scenario.start, refused)
            finally:
                client.close()
        for name, onsets in simulated.result().items():
            result[name].ways["sql"] = onsets
    return result


def _differences(outcome: Outcome) -> list[rp.Difference]:
    rules = builtin_rules()
    exported = frozenset(r["alert"] for r in rp.exported_rules(prometheus_rules(rules)))
    every = frozenset(rule.name for rule in rules)
    only = {"sql": every, "engine": every, "promql": exported}
    return rp.differences({way: outcome.ways[way] for way in rp.WAYS}, outcome.end, only)


@pytest.mark.parametrize("name", rp.SCENARIOS)
def test_each_rule_raises_the_same_alerts_over_sql_over_prometheus_and_in_prometheus(
    outcomes: dict[str, Outcome], name: str
) -> None:
    """Every alert one way raises, the others raise within two evaluation intervals, but what ``CANNOT`` says a
    way cannot raise."""
    found = _differences(outcomes[name])
    print(f"\n{name}:\n  " + "\n  ".join(str(d) for d in found))
    assert [str(d) for d in found if not _known(d)] == []


def test_every_known_difference_still_occurs(outcomes: dict[str, Outcome]) -> None:
    """Each ``CANNOT`` and ``INSTEAD`` entry explains some difference of some scenario (else it is stale: remove
    it)."""
    known = [d for o in outcomes.values() for d in _differences(o) if _known(d)]
    used = {(way, _subject(d.key)) for d in known for way in (*d.missing, *d.onsets)}
    assert (set(CANNOT) | set(INSTEAD)) - used == set()


def test_prometheus_evaluates_every_exported_rule(outcomes: dict[str, Outcome]) -> None:
    assert [line for outcome in outcomes.values() for line in outcome.refused] == []


@pytest.mark.parametrize("name", ["faults", "hangs", "fabric"])
def test_the_fault_scenarios_raise_alerts_each_way(outcomes: dict[str, Outcome], name: str) -> None:
    """The comparison is not empty: each way raises alerts (confounders.toml is meant to raise none)."""
    assert all(outcomes[name].ways[way] for way in rp.WAYS), {w: len(o) for w, o in outcomes[name].ways.items()}
