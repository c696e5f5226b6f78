"""The alert engine's rounds over a real Prometheus: detection scenarios (tests/alerts/scenarios.py) written as TSDB
blocks (the exporter's own pages of the simulated cluster, every 10 s, by ``promtool tsdb create-blocks-from
openmetrics``), then replayed round by round three ways: from the simulator's snapshots (what the collector and the
SQL store give the engine), from Prometheus read whole (``store_round``), and from Prometheus read where a rule could
fire (``promround.prom_round``). The filtered rounds give the engine the same alerts as the whole ones at every
round, and the same alerts as the snapshots; and they read a bounded share of what the whole ones read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import pytest

from gpulens.alerts.base import AlertRule
from gpulens.alerts.engine import AlertEngine
from gpulens.alerts.promround import round_reader, whole_reads_needed
from gpulens.alerts.rules import builtin_rules
from gpulens.alerts.state import FIRING
from gpulens.alerts.storeround import fabric_reads, round_reads, store_round
from gpulens.alerts.userrules import THRESHOLD_CHECK
from gpulens.exporter.sim import SimCluster, parse_scenario
from gpulens.model import NodeUnavailableError
from gpulens.settings import StoreAuth
from gpulens.storage.prometheus import PromReader
from tests.alerts import scenarios
from tests.prom import running_prometheus
from tests.storage.promblocks import blocks_from_openmetrics, scenario_openmetrics

STEP_S: Final = 10.0  # the scrape interval the history is written at
ROUND_S: Final = 60.0  # the engine's interval, in all three ways
SPACING_S: Final = 4 * 3600  # each scenario's history starts this long after the previous one's
SCENARIOS: Final = {
    "gpu-faults": scenarios.gpu_faults(2, "H100-SXM5-80GB", 1),
    "job-faults": scenarios.job_faults(2, "H100-SXM5-80GB", 11, "pair"),
    "healthy": scenarios.healthy(2, "H100-SXM5-80GB", 2, False),
}
FIRST_ROUNDS: Final = {"healthy": (20 * 60.0, 4)}  # (from, rounds): a few rounds of a cluster where nothing fires
MAX_AGE_S: Final = ROUND_S


class Clock:
    def __init__(self) -> None:
        self.at = 0.0

    def now(self) -> float:
        return self.at

    def monotonic(self) -> float:
        return self.at


@dataclass
class Replay:
    """What each way gave, round by round."""

    states: dict[str, list[frozenset[tuple[str, frozenset[tuple[str, str]], str]]]] = field(default_factory=dict)
    fired: dict[str, set[tuple[str, frozenset[tuple[str, str]]]]] = field(default_factory=dict)
    reads: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # (queries, series) per round
    # each way's incidents: (culprit, jobs) of every incident its engine formed
    incidents: dict[str, set[tuple[str, tuple[str, ...]]]] = field(default_factory=dict)
    gpus: int = 0
    fabric: tuple[int, int] = (0, 0)  # (queries, series) of a round's reads beyond the GPUs: ports, hosts, NCCL
    whole_with_user_rules: bool = False  # whole_reads_needed once a user threshold rule is configured


def _identity(labels: dict[str, str]) -> frozenset[tuple[str, str]]:
    return frozenset((k, v) for k, v in labels.items() if k != "target")


def _replay(base: str, text: str, offset: float, first: tuple[float, int] | None) -> Replay:
    scenario = parse_scenario(text)
    start, most = (scenario.start, 10**6) if first is None else (scenario.start + first[0], first[1])
    sim = SimCluster(scenario)
    clock = Clock()
    store = PromReader("prometheus+" + base, StoreAuth(min_step_s=STEP_S), clock=clock)
    rules = builtin_rules()
    engines = {way: AlertEngine(rules) for way in ("snapshots", "whole", "filtered")}
    # the engine once it has judged a round (None before: the reader's first round is whole)
    filtered = round_reader(store, rules, lambda: engines["filtered"] if k else None)
    out = Replay()
    user_rule = AlertRule("HotGpu", "warning", 0.0, check=THRESHOLD_CHECK)
    out.whole_with_user_rules = whole_reads_needed(store, [*rules, user_rule])
    k = 0
    try:
        while (t := start + k * ROUND_S) < scenario.end - 1e-9 and k < most:
            clock.at = t + offset
            snapshots = []
            for node in sim.node_names():
                try:
                    snapshots.append(sim.snapshot(node, t))
                except NodeUnavailableError:
                    continue
            engines["snapshots"].process(t + offset, snapshots, [])
            if k == 1:  # what the rounds read beyond the GPUs, once: a fixed number of queries, a series per port
                before = (store.client.stats.queries, store.client.stats.series)
                fabric_reads(store, max_age_s=MAX_AGE_S, reads=round_reads(rules))
                out.fabric = (store.client.stats.queries - before[0], store.client.stats.series - before[1])
            for way in ("whole", "filtered"):
                before = (store.client.stats.queries, store.client.stats.series)
                if way == "whole":
                    result = store_round(store, t + offset, max_age_s=MAX_AGE_S)
                else:  # as `alerts run` reads: its first round whole, every later one filtered
                    assert not whole_reads_needed(store, rules)
                    result = filtered(t + offset, MAX_AGE_S)
                out.reads.setdefault(way, []).append(
                    (store.client.stats.queries - before[0], store.client.stats.series - before[1])
                )
                out.gpus = max(out.gpus, sum(len(s.gpus) for s in result.snapshots))
                engines[way].process(result.time, result.snapshots, [])
            for way, engine in engines.items():
                states = frozenset((s.rule, _identity(dict(s.labels)), s.state) for s in engine.states.values())
                out.states.setdefault(way, []).append(states)
                fired = {(s.rule, _identity(dict(s.labels))) for s in engine.states.values() if s.state == FIRING}
                out.fired.setdefault(way, set()).update(fired)
                formed = {(i.culprit.key, i.jobs) for i in engine.incidents.values()}
                out.incidents.setdefault(way, set()).update(formed)
            k += 1
    finally:
        store.close()
    return out


@pytest.fixture(scope="module")
def replays(tmp_path_factory: pytest.TempPathFactory, prometheus_bin: str, promtool: str) -> dict[str, Replay]:
    work = tmp_path_factory.mktemp("promrounds")
    source = work / "history.om"
    with source.open("w") as out:
        for i, text in enumerate(SCENARIOS.values()):
            out.writelines(scenario_openmetrics(text, i * SPACING_S, STEP_S))
        out.write("# EOF\n")
    blocks_from_openmetrics(promtool, source, work / "tsdb")
    flags = ("--storage.tsdb.retention.time=100y", "--query.lookback-delta=5m")
    with running_prometheus(prometheus_bin, Path(work), {}, flags=flags) as base:
        return {
            name: _replay(base, text, i * SPACING_S, FIRST_ROUNDS.get(name))
            for i, (name, text) in enumerate(SCENARIOS.items())
        }


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_filtered_rounds_give_the_alerts_of_whole_rounds_at_every_round(replays: dict[str, Replay], name: str) -> None:
    replay = replays[name]
    whole, filtered = replay.states["whole"], replay.states["filtered"]
    differ = [(k, sorted(a ^ b, key=str)) for k, (a, b) in enumerate(zip(whole, filtered, strict=True)) if a != b]
    assert differ == [], differ[:3]


@pytest.mark.parametrize("name", ["gpu-faults", "job-faults"])
def test_filtered_rounds_fire_what_the_snapshots_fire(replays: dict[str, Replay], name: str) -> None:
    replay = replays[name]
    assert replay.fired["filtered"] == replay.fired["snapshots"]


@pytest.mark.parametrize("name", ["gpu-faults", "job-faults"])
def test_the_engine_over_prometheus_forms_the_incidents_of_the_snapshots(replays: dict[str, Replay], name: str) -> None:
    replay = replays[name]
    assert replay.incidents["snapshots"]  # each scenario's faults are incidents
    assert replay.incidents["filtered"] == replay.incidents["snapshots"]
    assert len({rule for rule, _ in replay.fired["filtered"]}) >= 3, "the scenario fires its faults' alerts"


def test_a_filtered_round_reads_a_bounded_share_of_a_whole_one(replays: dict[str, Replay]) -> None:
    replay = replays["healthy"]
    gpus = replay.gpus
    assert gpus == 16
    assert replay.reads["filtered"][0][1] == replay.reads["whole"][0][1]  # the first round is whole
    for k, ((q_whole, s_whole), (q_filtered, s_filtered)) in enumerate(
        zip(replay.reads["whole"][1:], replay.reads["filtered"][1:], strict=True)
    ):
        # the second round reads the GPUs' constants too: 6 queries, 8 series per GPU
        queries, per_gpu = (20, 19) if k else (26, 27)
        fabric_queries, fabric_series = replay.fabric
        assert q_filtered <= queries + fabric_queries, k  # a fixed number of queries, whatever the cluster
        assert q_filtered <= q_whole
        # every GPU's round fields and sample time (18 series), the targets and jobs: never every field of every GPU
        assert s_filtered <= per_gpu * gpus + 4 + fabric_series, (k, s_filtered, s_whole)
        assert s_whole >= 45 * gpus


def test_a_user_threshold_rule_makes_rounds_read_every_gpu_whole(replays: dict[str, Replay]) -> None:
    assert all(replay.whole_with_user_rules for replay in replays.values())
