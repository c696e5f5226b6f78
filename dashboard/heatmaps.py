"""The heatmap metric catalogue: what a node x GPU (or GPU x time) heatmap can be coloured by, with its scale.

Each metric reads one value from a :class:`GpuReading`; derived ratios come from :mod:`gpulens.ratios`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from gpulens.dashboard.formatting import celsius_text, percent_text
from gpulens.model import GpuReading
from gpulens.ratios import memory_used_ratio_of, nvlink_utilization_ratio, pcie_utilization_ratio, power_limit_ratio_of


@dataclass(frozen=True, slots=True)
class Metric:
    """What a node x GPU heatmap is coloured by."""

    key: str
    label: str
    value: Callable[[GpuReading], float | None]
    text: Callable[[float], str]
    zmin: float
    zmax: float
    colorscale: str
    ticks: tuple[tuple[float, str], ...] = ()


_RATIO_TICKS: Final = ((0.0, "0%"), (0.5, "50%"), (1.0, "100%"))

# The reading fields each metric below reads: what a page showing it asks a store for (fewer series from Prometheus).
_PCIE: Final = ("pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second", "pcie_link_generation", "pcie_link_width")
_NVLINK: Final = ("nvlink_tx_bytes_per_second", "nvlink_rx_bytes_per_second", "nvlink_links_active")
METRIC_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "utilization": ("utilization_ratio",),
    "memory": ("memory_used_bytes", "memory_total_bytes"),
    "temperature": ("temperature_celsius",),
    "power": ("power_watts", "power_limit_watts"),
    "pcie": _PCIE,
    "nvlink": _NVLINK,
}
METRICS: Final[dict[str, Metric]] = {
    m.key: m
    for m in (
        Metric(
            "utilization", "Utilization", lambda r: r.utilization_ratio, percent_text, 0, 1, "Viridis", _RATIO_TICKS
        ),
        Metric("memory", "Memory used", memory_used_ratio_of, percent_text, 0, 1, "Cividis", _RATIO_TICKS),
        Metric("temperature", "Temperature", lambda r: r.temperature_celsius, celsius_text, 25, 95, "YlOrRd"),
        Metric("power", "Power (of limit)", power_limit_ratio_of, percent_text, 0, 1, "Plasma", _RATIO_TICKS),
        Metric("pcie", "PCIe (of link max)", pcie_utilization_ratio, percent_text, 0, 1, "Deep_r", _RATIO_TICKS),
        Metric("nvlink", "NVLink (of link max)", nvlink_utilization_ratio, percent_text, 0, 1, "Haline", _RATIO_TICKS),
    )
}
DEFAULT_METRIC: Final = "utilization"
