"""Throttle reasons for a dcgm-exporter page without clock-event reasons: ``ThrottleTracker``, one per page reader.

dcgm-exporter's default counters do not include DCGM field 112 (``DCGM_FI_DEV_CLOCKS_EVENT_REASONS``), so a default
install says nothing of why a GPU is slow. Each reading's ``throttle_reasons`` and ``throttle_reasons_source``
(``gpulens.model.THROTTLE_SOURCES``) come from the first of these that the page allows:

1. **reported**: field 112 itself; or dcgm-exporter's ``DCGM_EXP_CLOCK_EVENTS_COUNT`` (samples of field 112 within
   its window, per reason): a reason is active while its count is above 0 and did not fall since the previous page. A
   steady reason keeps its count as old samples leave the window and new ones enter; an ended one's count falls.
2. **violation**: DCGM's ``*_VIOLATION`` time counters, compared with the previous page of the same GPU: a counter that
   rose is its reason (``VIOLATION_REASONS``). Board-limit and reliability violations have no clock-event reason;
   they stay counters. A counter that fell was reset and says nothing this page.
3. **inferred**: a busy GPU (utilization unknown or at least ``BUSY_UTILIZATION``) whose SM clock is below
   ``SLOW_CLOCK_RATIO`` of its maximum is thermally slowed (``sw_thermal``) when its temperature is within
   ``HOT_MARGIN_CELSIUS`` of its slowdown temperature, and power capped (``sw_power_cap``) when it draws at least
   ``CAPPED_POWER_RATIO`` of its power limit; neither: no reason (0). Maximum clock, slowdown temperature and power
   limit are the page's where it serves them (fields 113, 158, 164/160), else the model's (``gpulens.hardware``).
   Without an SM clock, or a maximum for it, nothing is inferred and the reasons stay unknown (``None``).

The first page of a GPU that serves violation counters but no clock events has nothing to compare with: its reasons
are inferred, and the counters decide from the second page on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Final

from gpulens.hardware import GpuModelFacts, find_gpu_model
from gpulens.model import THROTTLE_INFERRED, THROTTLE_REASONS, THROTTLE_REPORTED, THROTTLE_VIOLATION, GpuReading

_BIT: Final = dict(THROTTLE_REASONS)
# Each violation counter and the clock-event reason it stands for (None: no such reason).
VIOLATION_REASONS: Final[Mapping[str, int | None]] = {
    "power_violation_seconds_total": _BIT["sw_power_cap"],
    "thermal_violation_seconds_total": _BIT["sw_thermal"],
    "sync_boost_violation_seconds_total": _BIT["sync_boost"],
    "low_utilization_violation_seconds_total": _BIT["idle"],
    "board_limit_violation_seconds_total": None,
    "reliability_violation_seconds_total": None,
}
SLOW_CLOCK_RATIO: Final = 0.9
BUSY_UTILIZATION: Final = 0.5
HOT_MARGIN_CELSIUS: Final = 3.0
CAPPED_POWER_RATIO: Final = 0.95


@dataclass(slots=True)
class _Previous:
    """What the previous page said of one GPU."""

    violations: dict[str, float] = field(default_factory=dict)
    clock_events: dict[int, int] | None = None


def model_facts(reading: GpuReading) -> GpuModelFacts | None:
    """The datasheet facts of the reading's model (its NVML product name), if ``gpulens.hardware`` knows it."""
    return find_gpu_model(reading.model)


def inferred_reasons(reading: GpuReading) -> int | None:
    """Reasons inferred from clock, temperature and power (step 3 of the module docstring); None: cannot tell."""
    facts = model_facts(reading)
    top = reading.max_sm_clock_hertz or (facts.max_sm_clock_hertz if facts else None)
    clock = reading.sm_clock_hertz
    if clock is None or not top:
        return None
    busy = reading.utilization_ratio is None or reading.utilization_ratio >= BUSY_UTILIZATION
    if not busy or clock >= SLOW_CLOCK_RATIO * top:
        return 0
    mask = 0
    slowdown = reading.slowdown_temperature_celsius or (facts.slowdown_temperature_celsius if facts else None)
    temperature = reading.temperature_celsius
    if temperature is not None and slowdown and temperature >= slowdown - HOT_MARGIN_CELSIUS:
        mask |= _BIT["sw_thermal"]
    limit = reading.power_limit_watts or (facts.board_power_watts if facts else None)
    if reading.power_watts is not None and limit and reading.power_watts >= CAPPED_POWER_RATIO * limit:
        mask |= _BIT["sw_power_cap"]
    return mask


def _window_reasons(counts: Mapping[int, int], before: Mapping[int, int] | None) -> int:
    mask = 0
    for bit, count in counts.items():
        if count > 0 and (before is None or count >= before.get(bit, 0)):
            mask |= bit
    return mask


def _violation_reasons(now: Mapping[str, float], before: Mapping[str, float]) -> int | None:
    """The reasons whose counters rose; None when no counter of this page was on the previous one."""
    compared = [name for name in now if name in before]
    if not compared:
        return None
    mask = 0
    for name in compared:
        bit = VIOLATION_REASONS[name]
        if bit is not None and now[name] > before[name]:
            mask |= bit
    return mask


class ThrottleTracker:
    """Gives each reading of one dcgm-exporter its throttle reasons and their source. Not thread-safe."""

    def __init__(self) -> None:
        self._previous: dict[str, _Previous] = {}

    def forget(self, uuid: str) -> None:
        self._previous.pop(uuid, None)

    def apply(self, reading: GpuReading, clock_events: Mapping[int, int] | None) -> GpuReading:
        """``reading`` with ``throttle_reasons`` and ``throttle_reasons_source`` set as the module docstring says."""
        previous = self._previous.setdefault(reading.uuid, _Previous())
        violations = {name: v for name in VIOLATION_REASONS if (v := getattr(reading, name)) is not None}
        before_violations, before_events = previous.violations, previous.clock_events
        previous.violations, previous.clock_events = violations, None if clock_events is None else dict(clock_events)
        if reading.throttle_reasons is not None:
            return replace(reading, throttle_reasons_source=THROTTLE_REPORTED)
        if clock_events is not None:
            mask = _window_reasons(clock_events, before_events)
            return replace(reading, throttle_reasons=mask, throttle_reasons_source=THROTTLE_REPORTED)
        risen = _violation_reasons(violations, before_violations)
        if risen is not None:
            return replace(reading, throttle_reasons=risen, throttle_reasons_source=THROTTLE_VIOLATION)
        inferred = inferred_reasons(reading)
        if inferred is None:
            return reading
        return replace(reading, throttle_reasons=inferred, throttle_reasons_source=THROTTLE_INFERRED)
