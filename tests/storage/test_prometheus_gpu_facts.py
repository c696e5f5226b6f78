"""``alertread.GpuFacts`` over a real Prometheus: each GPU's hardware constants are read once, for every GPU again
each ``refresh_s``, and a GPU Prometheus holds no facts of is asked again ``retry_s`` later, not every round.

The history is written as a TSDB block (``promtool tsdb create-blocks-from openmetrics``): GPU ``gpu-a`` from the
start, ``gpu-b`` only from 600 s (its node joining late).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from gpulens.clock import ManualClock
from gpulens.settings import StoreAuth
from gpulens.storage.prometheus import PromReader
from gpulens.storage.prometheus.alertread import FACTS_REFRESH_S, FACTS_RETRY_S, GpuFacts
from tests.prom import running_prometheus
from tests.storage.promblocks import blocks_from_openmetrics

T0: Final = 1_700_000_000.0
FACT_FIELDS: Final = (
    "memory_total_bytes",
    "pcie_link_generation_max",
    "pcie_link_width_max",
    "slowdown_temperature_celsius",
)
MEMORY: Final = {"gpu-a": 85899345920, "gpu-b": 150754820096}


def _history() -> Iterator[str]:
    for k in range(0, 1500, 10):
        stamp = f"{T0 + k:.3f}"
        for gpu, uuid in enumerate(MEMORY):
            if uuid == "gpu-b" and k < 600:
                continue
            labels = f'node="n{gpu}",gpu="{gpu}",uuid="{uuid}",model="H100-SXM5-80GB",instance="n{gpu}:9410"'
            yield f"gpulens_gpu_up{{{labels}}} 1 {stamp}\n"
            yield f"gpulens_gpu_memory_total_bytes{{{labels}}} {MEMORY[uuid]} {stamp}\n"
            yield f"gpulens_gpu_slowdown_temperature_celsius{{{labels}}} 87 {stamp}\n"
            for state, width, generation in (("current", 8, 4), ("max", 16, 5)):
                yield f'gpulens_gpu_pcie_link_width{{{labels},state="{state}"}} {width} {stamp}\n'
                yield f'gpulens_gpu_pcie_link_generation{{{labels},state="{state}"}} {generation} {stamp}\n'


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory, prometheus_bin: str, promtool: str) -> Iterator[str]:
    work = tmp_path_factory.mktemp("gpufacts")
    source = work / "history.om"
    source.write_text("".join(_history()) + "# EOF\n")
    blocks_from_openmetrics(promtool, source, work / "tsdb")
    flags = ("--storage.tsdb.retention.time=100y", "--query.lookback-delta=1m")
    with running_prometheus(prometheus_bin, Path(work), {}, flags=flags) as base:
        yield base


def test_facts_are_read_once_refreshed_and_a_missing_gpu_asked_again_later(prometheus: str) -> None:
    clock = ManualClock(T0)
    store = PromReader("prometheus+" + prometheus, StoreAuth(min_step_s=10.0), clock=clock)
    facts = GpuFacts(store, FACT_FIELDS)
    stats = store.client.stats
    gpus = list(MEMORY)

    def at(t: float) -> tuple[set[str], int]:
        clock.set(T0 + t)
        before = stats.queries
        held = facts.of(gpus)
        return set(held), stats.queries - before

    try:
        held, queries = at(300.0)  # the first call reads every GPU: gpu-b has no series yet
        assert held == {"gpu-a"}
        assert queries > 0
        a = facts.of(gpus)["gpu-a"]
        assert (a.memory_total_bytes, a.pcie_link_generation_max, a.pcie_link_width_max) == (MEMORY["gpu-a"], 5, 16)
        assert a.slowdown_temperature_celsius == 87
        assert at(300.0 + FACTS_RETRY_S / 2) == ({"gpu-a"}, 0)  # gpu-b is not asked for again at once
        held, queries = at(300.0 + FACTS_RETRY_S)  # but once the retry is due: still nothing of it
        assert held == {"gpu-a"}
        assert queries > 0
        held, queries = at(650.0)  # its series have begun
        assert held == set(MEMORY)
        assert queries > 0
        assert facts.of(gpus)["gpu-b"].memory_total_bytes == MEMORY["gpu-b"]
        assert at(700.0) == (set(MEMORY), 0)  # known: no query
        held, queries = at(300.0 + FACTS_REFRESH_S)  # every GPU again, each refresh
        assert held == set(MEMORY)
        assert queries > 0
    finally:
        store.close()
