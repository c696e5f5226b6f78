"""The throttle-reason bits the simulator sets, named once (NVML's clocks-event reasons, ``gpulens.model``)."""

from __future__ import annotations

from typing import Final

from gpulens.model import THROTTLE_REASONS

_BIT: Final = dict(THROTTLE_REASONS)
IDLE: Final = _BIT["idle"]
SW_POWER_CAP: Final = _BIT["sw_power_cap"]
SW_THERMAL: Final = _BIT["sw_thermal"]
THERMAL: Final = _BIT["sw_thermal"] | _BIT["hw_thermal"] | _BIT["hw_slowdown"]
