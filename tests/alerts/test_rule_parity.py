"""One rule means the same wherever it runs: over each example scenario (faults, hangs with NCCL RAS, fabric,
confounders) the alert engine over SQL (``gpulens simulate``), the same engine over Prometheus (``gpulens alerts
run --db prometheus+...``) and Prometheus evaluating ``gpulens rules export --format prometheus`` raise the same
alerts, each beginning to fire within two evaluation intervals of the others (``tests/alerts/ruleparity.py`` says
how alerts are told apart and compared). Rules the export cannot say in PromQL (``NOT_EXPORTED``) are compared
between the two engines only.

One Prometheus serves every scenario's history (the exporter's own pages every 10 s, written as TSDB blocks, each
scenario four hours after the previous one). Backfilled blocks carry no staleness markers, so Prometheus runs with a
30 s lookback instead of 5 minutes: a series that leaves a page, or a node that stops answering, is gone 30 s later,
as the markers of a scraping Prometheus would make it.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

from gpulens.alerts.promexport import NOT_EXPORTED, prometheus_rules
from gpulens.alerts.rules import builtin_rules
from gpulens.exporter.sim import parse_scenario
from gpulens.settings import StoreAuth
from gpulens.storage.prometheus.client import PromClient
from tests.alerts import ruleparity as rp
from tests.prom import running_prometheus
from tests.storage.promblocks import blocks_from_openmetrics, scenario_openmetrics

# Differences the test knows of, by scenario: each line as ``ruleparity.differences`` words it, and why it stays.
KNOWN: Final[dict[str, frozenset[str]]] = {name: frozenset() for name in rp.SCENARIOS}


@dataclass
class Outcome:
    ways: dict[str, rp.Onsets]
    end: float
    refused: list[str]


def _simulate_all() -> dict[str, rp.Onsets]:
    return {name: rp.sql_onsets(name) for name in rp.SCENARIOS}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory, prometheus_bin: str, promtool: str) -> Iterator[dict[str, Outcome]]:
    import time as _t; T0 = _t.perf_counter()
    work = tmp_path_factory.mktemp("ruleparity")
    rules = builtin_rules()
    exported = rp.exported_rules(prometheus_rules(rules))
    scopes = {rule.name: rule.scope for rule in rules}
    only = {
        "sql": frozenset(scopes),
        "engine": frozenset(scopes),
        "promql": frozenset(r["alert"] for r in exported),
    }
    assert not only["promql"] & set(NOT_EXPORTED)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        simulated = pool.submit(_simulate_all)  # the SQL way beside the history's writing
        source = work / "history.om"
        texts = {name: rp.scenario_text(name) for name in rp.SCENARIOS}
        with source.open("w") as out:
            for i, text in enumerate(texts.values()):
                out.writelines(scenario_openmetrics(text, i * rp.SPACING_S, rp.STEP_S, leave_out=rp.UNREAD))
            out.write("# EOF\n")
        import time as _t; print("om", _t.perf_counter() - T0)
        blocks_from_openmetrics(promtool, source, work / "tsdb")
        print("blocks", _t.perf_counter() - T0)
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
                    print("engine", name, _t.perf_counter() - T0)
                    onsets, refused = promql.result()
                    print("promql", name, _t.perf_counter() - T0)
                    result[name] = Outcome(
                        {"engine": engine, "promql": onsets}, scenario.end - scenario.start, refused
                    )
            finally:
                client.close()
        print("prom done", _t.perf_counter() - T0)
        for name, onsets in simulated.result().items():
            result[name].ways["sql"] = onsets
    print("sql done", _t.perf_counter() - T0)
    yield result


@pytest.mark.parametrize("name", rp.SCENARIOS)
def test_each_rule_raises_the_same_alerts_over_sql_over_prometheus_and_in_prometheus(
    outcomes: dict[str, Outcome], name: str
) -> None:
    outcome = outcomes[name]
    rules = builtin_rules()
    exported = frozenset(r["alert"] for r in rp.exported_rules(prometheus_rules(rules)))
    every = frozenset(rule.name for rule in rules)
    only = {"sql": every, "engine": every, "promql": exported}
    ways = {way: outcome.ways[way] for way in rp.WAYS}
    found = rp.differences(ways, outcome.end, only)
    print(f"\n{name}:\n  " + "\n  ".join(found))
    assert set(found) == KNOWN[name], "\n".join(sorted(set(found) ^ KNOWN[name]))


@pytest.mark.parametrize("name", rp.SCENARIOS)
def test_prometheus_evaluates_every_exported_rule_and_the_scenario_raises_alerts_each_way(
    outcomes: dict[str, Outcome], name: str
) -> None:
    outcome = outcomes[name]
    assert outcome.refused == []
    assert all(outcome.ways[way] for way in rp.WAYS), {way: len(o) for way, o in outcome.ways.items()}
