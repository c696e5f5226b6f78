"""The rolling window: expiry, per-GPU series, per-job views and summaries, missing nodes and lost GPUs."""

from __future__ import annotations

import pytest

from gpulens.alerts.history import History, JobPause, summarise_job, traffic_bytes_per_second
from gpulens.model import GpuReading

from .support import STEP, T0, Feed, healthy_gpu, job_snapshot, snapshot, target, training, uuid


def test_old_rounds_leave_the_window() -> None:
    feed = Feed(window_s=60.0)
    for i in range(20):
        feed.add([snapshot("node-00", [healthy_gpu(utilization_ratio=i / 100)])])
    history = feed.history
    assert [r.time for r in history.rounds] == [feed.now - STEP * k for k in range(6, -1, -1)]
    series = history.series(uuid("node-00", 0))
    assert len(series) == 7
    assert series[-1][1].utilization_ratio == pytest.approx(0.19)
    since = history.reading_since(uuid("node-00", 0), feed.now - 25.0)
    assert since is not None
    assert since[0] == feed.now - 20.0


def test_gpus_that_leave_are_forgotten() -> None:
    feed = Feed(window_s=30.0)
    feed.add([snapshot("node-00", [healthy_gpu(index=0), healthy_gpu(index=1)])])
    for _ in range(5):
        feed.add([snapshot("node-00", [healthy_gpu(index=0)])])
    assert feed.history.series(uuid("node-00", 1)) == ()
    assert feed.history.first_seen(uuid("node-00", 1)) is None


def test_rounds_must_come_in_order() -> None:
    history = History()
    history.add(T0, [])
    with pytest.raises(ValueError, match="older"):
        history.add(T0 - 1, [])


def test_job_views_order_gpus_by_node_and_index() -> None:
    feed = Feed()
    feed.add([job_snapshot("node-01", training, [2, 0]), job_snapshot("node-00", training, [5])])
    latest = feed.history.latest
    assert latest is not None
    view = latest.jobs["train"]
    assert view.gpus == (uuid("node-00", 5), uuid("node-01", 0), uuid("node-01", 2))
    assert view.user == "alice"
    assert latest.nodes == {"node-00", "node-01"}


def test_job_summary() -> None:
    readings = [
        training("n", 0, sm_clock_hertz=1980e6),
        training("n", 1, sm_clock_hertz=990e6, power_watts=400.0),
        training("n", 2, utilization_ratio=0.5, pcie_tx_bytes_per_second=None, pcie_rx_bytes_per_second=None),
    ]
    summary = summarise_job(T0, readings)
    assert summary.gpus == 3
    assert summary.utilization_min == 0.5
    assert summary.traffic_max == 102e9
    assert summary.traffic_median == 102e9
    assert summary.power_median == 560.0
    assert summary.clock_ratio_min == pytest.approx(0.5)
    assert not summary.is_reference  # one clock far below the others: not normal work
    assert summary.utilization_max == 0.97
    assert summary.memory_min == summary.memory_median == 68 * (1 << 30)
    assert not summary.is_pause


def test_job_pauses_the_job_came_back_from_are_remembered() -> None:
    feed = Feed(window_s=60.0)

    def rank(utilization: float):
        return lambda _: [job_snapshot("node-00", lambda n, i: training(n, i, utilization_ratio=utilization), [0, 1])]

    feed.repeat(6, rank(0.0))  # its start (compilation): not a phase of its work
    assert feed.history.job_pause("train") == JobPause(T0, 0.0)
    feed.repeat(3, rank(0.97))
    assert feed.history.job_pause("train") == JobPause(None, 0.0)
    feed.repeat(30, rank(0.04))  # a checkpoint of 5 minutes, longer than the window
    began = feed.now - 29 * STEP
    assert feed.history.job_pause("train") == JobPause(began, 0.0)
    feed.repeat(3, rank(0.97))
    assert feed.history.job_pause("train") == JobPause(None, 300.0)
    feed.repeat(2, rank(0.04))
    feed.add([job_snapshot("node-00", training, [0, 1])])
    assert feed.history.job_pause("train") == JobPause(None, 300.0)  # the longest stays
    assert feed.history.job_pause("other") == JobPause(None, 0.0)


def test_traffic_is_none_when_nothing_is_read() -> None:
    bare = GpuReading(node="n", gpu=0, uuid="u", model="m", timestamp=0.0)
    assert traffic_bytes_per_second(bare) is None
    assert traffic_bytes_per_second(healthy_gpu(nvlink_tx_bytes_per_second=None)) == 2e6


def test_missing_nodes_and_lost_gpus() -> None:
    feed = Feed()
    feed.add([snapshot("node-00", [healthy_gpu()]), snapshot("node-01", [healthy_gpu("node-01")])])
    lost = GpuReading(node="node-00", gpu=0, uuid=uuid("node-00", 0), model="m", timestamp=0.0, up=False)
    feed.add([snapshot("node-00", [lost])], [target("node-00"), target("node-01", up=False)])
    history = feed.history
    assert history.missing_nodes() == {"node-01"}
    assert history.lost_gpus() == {uuid("node-00", 0)}
    assert history.target_down_since("node-01") == feed.now
    feed.add([snapshot("node-00", [lost])], [target("node-01", up=False)])
    assert history.target_down_since("node-01") == feed.now - STEP
    feed.add([snapshot("node-01", [healthy_gpu("node-01")])], [target("node-01")])
    assert history.target_down_since("node-01") is None
    assert history.missing_nodes() == {"node-00"}
