"""The round pre-filters of the builtin rules: which GPUs a rule could fire on, told without reading them whole.

Each catalogue entry's ``RoundPlan`` (``alerts.definition``) names the functions here that apply to it. A test
from the round fields (``*_here``: a GPU's round-field reading against its hardware constants) or a PromQL filter
(``*_filter``) names a superset of the GPUs the rule's check fires on: each threshold is loosened by ``SLACK`` so
that a float rounded differently in Prometheus never hides a GPU, and a constant Prometheus does not hold fails the
check too. The error counters each error rule compares across its window are the checks' own (``alerts.checks``).
"""

from __future__ import annotations

from typing import Final

from gpulens.alerts.base import AlertRule
from gpulens.alerts.checks import HW_POWER_BRAKE_BIT, HW_SLOWDOWN, SW_POWER_CAP, THERMAL_BITS
from gpulens.hardware import pcie_max_bytes_per_second
from gpulens.model import GpuReading
from gpulens.storage.prometheus.families import field_selector

# Thresholds are loosened by this share so that a float rounded differently in Prometheus never hides a GPU.
SLACK: Final = 1 - 1e-6
# What the job detectors summarise of each GPU every round (``alerts.jobround.summarise_job``)
JOB_FIELDS: Final = (
    "utilization_ratio",
    "memory_used_bytes",
    "power_watts",
    "sm_active_ratio",
    "sm_clock_hertz",
    "nvlink_tx_bytes_per_second",
    "nvlink_rx_bytes_per_second",
    "pcie_tx_bytes_per_second",
    "pcie_rx_bytes_per_second",
)
# The slowdown clock reasons any rule weighs (a GPU with none set reads ``throttle_reasons = None``, read as 0)
SLOWDOWN_REASONS: Final = ("hw_power_brake", "hw_slowdown", "hw_thermal", "sw_power_cap", "sw_thermal")
PCIE_TRAFFIC: Final = ("pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second")
NVLINK_TRAFFIC: Final = ("nvlink_tx_bytes_per_second", "nvlink_rx_bytes_per_second")
NVLINK_ERROR_FIELDS: Final = (
    "nvlink_crc_flit_errors_total",
    "nvlink_replay_errors_total",
    "nvlink_recovery_errors_total",
)


def _busier(reading: GpuReading, link: str) -> float | None:
    """The busier direction's rate of ``link`` (pcie, nvlink), None where neither is read."""
    rates = [
        r
        for r in (getattr(reading, f"{link}_tx_bytes_per_second"), getattr(reading, f"{link}_rx_bytes_per_second"))
        if r is not None
    ]
    return max(rates) if rates else None


def thermal_here(rule: AlertRule, reading: GpuReading, facts: GpuReading | None) -> bool:
    temp, slowdown = reading.temperature_celsius, facts.slowdown_temperature_celsius if facts else None
    margin = rule.threshold("margin_celsius") + 0.001
    hot = temp is not None and slowdown is not None and temp >= slowdown - margin
    return hot or bool((reading.throttle_reasons or 0) & (THERMAL_BITS | HW_SLOWDOWN))


def power_brake_here(rule: AlertRule, reading: GpuReading, facts: GpuReading | None) -> bool:
    return bool((reading.throttle_reasons or 0) & HW_POWER_BRAKE_BIT)


def power_cap_here(rule: AlertRule, reading: GpuReading, facts: GpuReading | None) -> bool:
    """sw_power_cap set: the rule then weighs power against the limit, which only a whole read holds (a GPU at its
    cap is the one the alert fires on, read whole anyway while it is pending or firing)."""
    return bool((reading.throttle_reasons or 0) & SW_POWER_CAP)


def memory_here(rule: AlertRule, reading: GpuReading, facts: GpuReading | None) -> bool:
    used, total = reading.memory_used_bytes, facts.memory_total_bytes if facts else None
    return used is not None and bool(total) and used >= rule.threshold("used_ratio") * SLACK * (total or 0)


def pcie_saturated_here(rule: AlertRule, reading: GpuReading, facts: GpuReading | None) -> bool:
    rate = _busier(reading, "pcie")
    ceiling = pcie_max_bytes_per_second(facts.pcie_link_generation_max, facts.pcie_link_width_max) if facts else None
    return rate is not None and bool(ceiling) and rate >= rule.threshold("utilization_ratio") * SLACK * (ceiling or 0)


def nvlink_saturated_here(rule: AlertRule, reading: GpuReading, facts: GpuReading | None) -> bool:
    rate, links = _busier(reading, "nvlink"), reading.nvlink_links_active
    share = rule.threshold("utilization_ratio") * rule.threshold("link_bytes_per_second") * SLACK
    return rate is not None and bool(links) and rate >= (links or 0) * share


def remap_failed_filter(rule: AlertRule) -> str:
    """A failed row remapping (``EccUncorrectable``'s part that no round field tells)."""
    return f"{field_selector('remapped_rows_failure')} != 0"


def pcie_below_max_filter(rule: AlertRule) -> str:
    """A link below its maximum: its current and maximum width (or generation) differ (one aggregation, no join).
    A generation below its maximum counts only while the GPU is busy; the filter names it busy or not (the GPU is
    then read whole and judged): the busy test's ceiling join costs Prometheus more than the rest of the filter."""
    families = (field_selector(f).partition("{")[0] for f in ("pcie_link_width", "pcie_link_generation"))
    return " or ".join(f"stddev by (uuid) ({family}) > 0" for family in families)
