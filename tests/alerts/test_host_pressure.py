"""The host rules on hand-made rounds: HostMemoryPressure (available memory under its floor) and HostCpuContention
(the node's CPUs saturated, or a job's cgroup at its CPU limit), one alert per node, each summary saying why."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from gpulens.alerts.names import HOST_CPU_CONTENTION, HOST_MEMORY_PRESSURE
from gpulens.fabricmodel import HostReading, JobHostReading

from .fabricsupport import fabric_snapshot, host, share
from .support import Feed, healthy_gpu, rule

TIB = 1 << 40


def judge(name: str, hosts: dict[str, HostReading], shares: Sequence[JobHostReading] = ()) -> list[Any]:
    feed = Feed()
    feed.add(
        [
            fabric_snapshot(
                node,
                [healthy_gpu(node, i) for i in range(2)],
                host_reading=reading,
                job_hosts=[s for s in shares if s.node == node],
            )
            for node, reading in hosts.items()
        ]
    )
    return feed.candidates([rule(name)])


def test_memory_pressure_below_five_percent_available() -> None:
    found = judge(
        HOST_MEMORY_PRESSURE,
        {
            "node-01": host("node-01", memory_total_bytes=TIB, memory_available_bytes=int(0.006 * TIB)),
            "node-02": host("node-02", memory_total_bytes=TIB, memory_available_bytes=int(0.06 * TIB)),
            "node-03": host("node-03", memory_total_bytes=TIB, memory_available_bytes=None),  # unread: no verdict
        },
    )
    [c] = found
    assert c.labels == {"alertname": HOST_MEMORY_PRESSURE, "severity": "warning", "node": "node-01"}
    assert c.value == pytest.approx(0.006)
    assert c.summary.startswith("node node-01: 0.6% of its memory available")


def test_cpu_contention_on_a_busy_node_or_a_cgroup_at_its_limit() -> None:
    hosts = {
        "node-01": host("node-01", cpu_busy_ratio=0.97),  # saturated, no job at its limit
        "node-02": host("node-02", cpu_busy_ratio=0.4),  # one job at 15.5 of its 16 cores
        "node-03": host("node-03", cpu_busy_ratio=0.9),  # busy, not saturated; its job at 90 % of its limit
        "node-04": host("node-04", cpu_busy_ratio=0.5),  # a job with no limit: judged by the node's share only
    }
    shares = [
        share("node-02", "loader", cpu_used_cores=15.5),
        share("node-02", "quiet", cpu_used_cores=2.0),
        share("node-03", "busy", cpu_used_cores=14.4),
        share("node-04", "free", cpu_used_cores=40.0, cpu_limit_cores=None),
    ]
    found = {c.labels["node"]: c for c in judge(HOST_CPU_CONTENTION, hosts, shares)}
    assert sorted(found) == ["node-01", "node-02"]
    assert found["node-01"].summary == "node node-01: CPUs 97% busy"
    assert found["node-02"].summary == "node node-02: job loader's cgroup at 15.5 of its 16 cores"
    assert found["node-02"].value == 15.5 / 16
    assert set(found["node-02"].labels) == {"alertname", "severity", "node"}
