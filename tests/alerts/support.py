"""Builders for hand-made rounds: GPU readings, node snapshots and a history fed from them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpulens.alerts.base import AlertRule
from gpulens.alerts.history import History
from gpulens.alerts.rules import builtin_rules, evaluate
from gpulens.model import GpuJob, GpuReading, NodeSnapshot, TargetHealth

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
STEP = 10.0
GIB = 1 << 30


def rule(name: str, **thresholds: float) -> AlertRule:
    """A builtin rule, with thresholds overridden."""
    found = next(r for r in builtin_rules() if r.name == name)
    return replace(found, thresholds={**found.thresholds, **thresholds}) if thresholds else found


def uuid(node: str, index: int) -> str:
    return f"GPU-{node}-{index}"


def healthy_gpu(node: str = "node-00", index: int = 0, **fields: Any) -> GpuReading:
    """An idle, healthy H100-like reading; ``fields`` change it."""
    base: dict[str, Any] = {
        "utilization_ratio": 0.0,
        "memory_used_bytes": GIB,
        "memory_total_bytes": 80 * GIB,
        "temperature_celsius": 35.0,
        "slowdown_temperature_celsius": 90.0,
        "power_watts": 70.0,
        "power_limit_watts": 700.0,
        "sm_clock_hertz": 1980e6,
        "max_sm_clock_hertz": 1980e6,
        "throttle_reasons": 0,
        "pcie_tx_bytes_per_second": 1e6,
        "pcie_rx_bytes_per_second": 1e6,
        "pcie_link_generation": 5,
        "pcie_link_generation_max": 5,
        "pcie_link_width": 16,
        "pcie_link_width_max": 16,
        "pcie_replays_total": 0,
        "nvlink_tx_bytes_per_second": 0.0,
        "nvlink_rx_bytes_per_second": 0.0,
        "nvlink_links_active": 18,
        "nvlink_crc_flit_errors_total": 0,
        "nvlink_replay_errors_total": 0,
        "nvlink_recovery_errors_total": 0,
        "ecc_uncorrected_errors_total": 0,
        "sm_active_ratio": 0.0,
        "tensor_active_ratio": 0.0,
    }
    base.update(fields)
    return GpuReading(
        node=node, gpu=index, uuid=uuid(node, index), model="NVIDIA H100 80GB HBM3", timestamp=0.0, **base
    )


def training(node: str, index: int, **fields: Any) -> GpuReading:
    """A rank of a communicating training job: busy, ~100 GB/s of NVLink, high power."""
    values: dict[str, Any] = {
        "utilization_ratio": 0.97,
        "power_watts": 560.0,
        "nvlink_tx_bytes_per_second": 50e9,
        "nvlink_rx_bytes_per_second": 50e9,
        "pcie_tx_bytes_per_second": 1e9,
        "pcie_rx_bytes_per_second": 1e9,
        "sm_active_ratio": 0.65,
        "tensor_active_ratio": 0.45,
        "memory_used_bytes": 68 * GIB,
    }
    values.update(fields)
    return healthy_gpu(node, index, **values)


def stalled(node: str, index: int, **fields: Any) -> GpuReading:
    """A rank spinning in a hung collective: 100% utilization, no traffic, power about idle."""
    values: dict[str, Any] = {
        "utilization_ratio": 1.0,
        "power_watts": 80.0,
        "nvlink_tx_bytes_per_second": 40e6,
        "nvlink_rx_bytes_per_second": 40e6,
        "pcie_tx_bytes_per_second": 10e6,
        "pcie_rx_bytes_per_second": 10e6,
        "sm_active_ratio": 0.03,
        "tensor_active_ratio": 0.0,
        "memory_used_bytes": 68 * GIB,
    }
    values.update(fields)
    return healthy_gpu(node, index, **values)


def blocked(node: str, index: int, **fields: Any) -> GpuReading:
    """A rank blocked on the host: idle, memory held, no traffic, idle power."""
    values: dict[str, Any] = {"memory_used_bytes": 68 * GIB, "throttle_reasons": 1}
    values.update(fields)
    return healthy_gpu(node, index, **values)


def snapshot(
    node: str, readings: Sequence[GpuReading], jobs: Mapping[int, tuple[str, str]] | None = None
) -> NodeSnapshot:
    """A node's snapshot; ``jobs`` maps a GPU index to (job id, user)."""
    records = tuple(GpuJob(node, i, uuid(node, i), job_id, user) for i, (job_id, user) in sorted((jobs or {}).items()))
    return NodeSnapshot(node=node, timestamp=0.0, source="test", gpus=tuple(readings), jobs=records)


Round = tuple[Sequence[NodeSnapshot], Sequence[TargetHealth]]


def target(node: str, up: bool = True, error: str | None = None) -> TargetHealth:
    return TargetHealth(node, f"http://{node}:9410", "gpulens", 0.0, up, node=node, last_error=error)


class Feed:
    """A history fed one round at a time, STEP seconds apart."""

    def __init__(self, window_s: float = 1800.0) -> None:
        self.history = History(window_s)
        self.now = T0 - STEP

    def add(self, snapshots: Sequence[NodeSnapshot], targets: Sequence[TargetHealth] = ()) -> float:
        self.now += STEP
        self.history.add(self.now, snapshots, targets)
        return self.now

    def repeat(self, count: int, make: Callable[[int], Sequence[NodeSnapshot]]) -> None:
        for i in range(count):
            self.add(make(i))

    def candidates(self, rules: Iterable[AlertRule]) -> list[Any]:
        return [c for c in evaluate(list(rules), self.history, self.now) if not c.hold]


def job_snapshot(
    node: str, make: Callable[[str, int], GpuReading], gpus: Iterable[int], job: str = "train", user: str = "alice"
) -> NodeSnapshot:
    indices = list(gpus)
    return snapshot(node, [make(node, i) for i in indices], {i: (job, user) for i in indices})
