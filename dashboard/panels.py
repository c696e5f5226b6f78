"""The metric charts of the node and GPU pages: every stored field of a set of GPUs, each against its limit.

Pure: ``gpu_charts`` takes each GPU's series (as storage returns them, counters already turned into rates) and
returns titled figures. One colour per GPU across all charts; a second series of the same GPU is dotted; limits are
red and dashed, drawn once when every GPU shares them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gpulens.dashboard.figures.periods import Period
from gpulens.dashboard.figures.style import LIMIT_COLOR
from gpulens.dashboard.figures.throttle import MaskSeries, throttle_timeline
from gpulens.dashboard.figures.timeseries import (
    CELSIUS,
    GIB,
    HERTZ,
    PER_SECOND,
    PERCENT,
    RATE,
    WATTS,
    Axis,
    Line,
    time_series,
)
from gpulens.hardware import nvlink_max_bytes_per_second, pcie_max_bytes_per_second
from gpulens.storage.records import SeriesData

# Every field the charts read, in one list, so a page asks storage for all of them in one query.
FIELDS: Final = (
    "utilization_ratio",
    "sm_active_ratio",
    "tensor_active_ratio",
    "memory_used_bytes",
    "memory_total_bytes",
    "temperature_celsius",
    "memory_temperature_celsius",
    "slowdown_temperature_celsius",
    "power_watts",
    "power_limit_watts",
    "sm_clock_hertz",
    "max_sm_clock_hertz",
    "memory_clock_hertz",
    "max_memory_clock_hertz",
    "throttle_reasons",
    "pcie_tx_bytes_per_second",
    "pcie_rx_bytes_per_second",
    "pcie_link_generation",
    "pcie_link_width",
    "nvlink_tx_bytes_per_second",
    "nvlink_rx_bytes_per_second",
    "nvlink_links_active",
    "ecc_corrected_errors_total",
    "ecc_uncorrected_errors_total",
    "pcie_replays_total",
    "nvlink_crc_flit_errors_total",
    "nvlink_replay_errors_total",
    "nvlink_recovery_errors_total",
    "xid_total",
)
ERROR_FIELDS: Final = {
    "ecc_corrected_errors_total": "ECC corrected",
    "ecc_uncorrected_errors_total": "ECC uncorrected",
    "pcie_replays_total": "PCIe replays",
    "nvlink_crc_flit_errors_total": "NVLink CRC",
    "nvlink_replay_errors_total": "NVLink replay",
    "nvlink_recovery_errors_total": "NVLink recovery",
    "xid_total": "XID events",
}

Values = Sequence[float | None]


@dataclass(frozen=True, slots=True)
class GpuSeries:
    """One GPU's series: ``values[field]`` aligned with ``times`` (seconds since the epoch)."""

    label: str  # "GPU 3" on a node page, "node-01:3" elsewhere
    color: str
    times: Sequence[float]
    values: Mapping[str, Values]

    def get(self, name: str) -> Values:
        return self.values.get(name) or [None] * len(self.times)


@dataclass(frozen=True, slots=True)
class Chart:
    key: str
    title: str
    figure: Any


def _lines(gpus: Sequence[GpuSeries], name: str, suffix: str = "", dash: str | None = None) -> list[Line]:
    return [Line(f"{g.label}{suffix}", g.times, g.get(name), color=g.color, dash=dash, group=g.label) for g in gpus]


def _derived(values: Sequence[Values], fn: Callable[..., float | None]) -> list[float | None]:
    return [fn(*point) for point in zip(*values, strict=True)]


def _limit_lines(
    gpus: Sequence[GpuSeries], label: str, limit: Callable[[GpuSeries], Values], dash: str = "dash"
) -> list[Line]:
    """The limit as one red dashed line when all GPUs share it, else one dashed line per GPU in its colour."""
    series = [(g, list(limit(g))) for g in gpus]
    present = {v for _, values in series for v in values if v is not None}
    if not present:
        return []
    if len(present) == 1:  # a constant: two points carry it
        value = present.pop()
        span = [min(g.times[0] for g in gpus if g.times), max(g.times[-1] for g in gpus if g.times)]
        return [Line(label, span, [value, value], color=LIMIT_COLOR, dash=dash, width=1.2)]
    return [
        Line(f"{g.label} {label}", g.times, values, color=g.color, dash=dash, group=g.label, width=1.0)
        for g, values in series
    ]


def _pcie_limit(g: GpuSeries) -> Values:
    return _derived([g.get("pcie_link_generation"), g.get("pcie_link_width")], _pcie_max)


def _pcie_max(gen: float | None, width: float | None) -> float | None:
    return pcie_max_bytes_per_second(int(gen) if gen else None, int(width) if width else None)


def _nvlink_limit(g: GpuSeries) -> Values:
    return [nvlink_max_bytes_per_second(int(n)) if n else None for n in g.get("nvlink_links_active")]


def gpu_charts(
    gpus: Sequence[GpuSeries], *, start: float, end: float, periods: Sequence[Period] = (), legend: bool = True
) -> list[Chart]:
    """The node/GPU page's charts, in reading order. Without ``legend`` the page shows one colour key for all."""

    def chart(key: str, title: str, lines: list[Line], axis: Axis, empty: str = "no data in this range") -> Chart:
        return Chart(
            key,
            title,
            time_series(lines, axis, start=start, end=end, periods=periods, legend=legend, empty=empty),
        )

    error_lines = [
        Line(
            f"{g.label} {text}", g.times, g.get(name), color=g.color, group=g.label, dash=None if i % 2 == 0 else "dot"
        )
        for i, (name, text) in enumerate(ERROR_FIELDS.items())
        for g in gpus
        if any(v for v in g.get(name))
    ]
    throttle = throttle_timeline(
        [
            MaskSeries(g.label, g.times, [None if m is None else int(m) for m in g.get("throttle_reasons")])
            for g in gpus
        ],
        start=start,
        end=end,
        periods=periods,
    )
    return [
        chart("utilization", "Utilization", _lines(gpus, "utilization_ratio"), PERCENT),
        chart(
            "activity",
            "SM activity (solid) and tensor activity (dotted)",
            _lines(gpus, "sm_active_ratio", " SM") + _lines(gpus, "tensor_active_ratio", " tensor", "dot"),
            PERCENT,
            "no profiling data (DCGM sources only)",
        ),
        chart(
            "memory",
            "Memory used against total",
            _lines(gpus, "memory_used_bytes") + _limit_lines(gpus, "total", lambda g: g.get("memory_total_bytes")),
            GIB,
        ),
        chart(
            "temperature",
            "GPU (solid) and memory (dotted) temperature against the slowdown threshold",
            _lines(gpus, "temperature_celsius")
            + _lines(gpus, "memory_temperature_celsius", " memory", "dot")
            + _limit_lines(gpus, "slowdown", lambda g: g.get("slowdown_temperature_celsius")),
            CELSIUS,
        ),
        chart(
            "power",
            "Power against its limit",
            _lines(gpus, "power_watts") + _limit_lines(gpus, "limit", lambda g: g.get("power_limit_watts")),
            WATTS,
        ),
        chart(
            "clocks",
            "SM clock (solid) and memory clock (dotted) against their maximums",
            _lines(gpus, "sm_clock_hertz")
            + _lines(gpus, "memory_clock_hertz", " memory", "dot")
            + _limit_lines(gpus, "max SM", lambda g: g.get("max_sm_clock_hertz"))
            + _limit_lines(gpus, "max memory", lambda g: g.get("max_memory_clock_hertz"), "dot"),
            HERTZ,
        ),
        Chart("throttle", "Throttle reasons", throttle),
        chart(
            "pcie",
            "PCIe TX (solid) and RX (dotted) against the link maximum",
            _lines(gpus, "pcie_tx_bytes_per_second", " TX")
            + _lines(gpus, "pcie_rx_bytes_per_second", " RX", "dot")
            + _limit_lines(gpus, "link max", _pcie_limit),
            RATE,
        ),
        chart(
            "nvlink",
            "NVLink TX (solid) and RX (dotted) against the link maximum",
            _lines(gpus, "nvlink_tx_bytes_per_second", " TX")
            + _lines(gpus, "nvlink_rx_bytes_per_second", " RX", "dot")
            + _limit_lines(gpus, "link max", _nvlink_limit),
            RATE,
            "no NVLink on these GPUs",
        ),
        chart("errors", "Error counters (per second)", error_lines, PER_SECOND, "no errors in this range"),
    ]


def gpu_series(data: SeriesData | None, label: str, color: str) -> GpuSeries:
    """A GPU's series as storage returned them (``None``: storage has none in the range)."""
    if data is None:
        return GpuSeries(label, color, [], {})
    return GpuSeries(label, color, data.timestamps, data.values)
