"""The time range every page shows: a preset (``15m`` ... ``7d``) ending now, or a custom from/to in UTC."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from gpulens.config import parse_timestamp

PRESETS: Final[dict[str, float]] = {"15m": 900.0, "1h": 3600.0, "6h": 6 * 3600.0, "24h": 86400.0, "7d": 7 * 86400.0}
CUSTOM: Final = "custom"
DEFAULT_RANGE: Final = "1h"
# A custom range reaches back at most this far when the store cannot say where its history begins.
UNKNOWN_HISTORY_S: Final = 10 * 366 * 86400.0
RANGE_OPTIONS: Final = (*PRESETS, CUSTOM)

# Auto-refresh choices, as the URL and the toolbar write them (gpulens.js turns them into periods).
REFRESH: Final = ("off", "10s", "30s", "1m", "5m")
DEFAULT_REFRESH: Final = "30s"


class RangeError(ValueError):
    """A custom range that cannot be used (unparsable time, end before start); the message is for the page."""


@dataclass(frozen=True, slots=True)
class TimeRange:
    """Seconds since the epoch, ``start < end``."""

    start: float
    end: float
    label: str

    @property
    def seconds(self) -> float:
        return self.end - self.start


def minute_text(seconds: float) -> str:
    """``2026-01-01 00:20 UTC``"""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M UTC")


def resolve_range(
    preset: str | None, start: str | None, end: str | None, now: float, *, history_start: float | None = None
) -> TimeRange:
    """The range a page's toolbar (or URL) asks for. An unknown preset means the default; a bad custom range raises.

    A custom range is clamped to the stored history: it ends at ``now`` at the latest and starts no earlier than
    ``history_start`` (or ``UNKNOWN_HISTORY_S`` before its end when that is unknown), so ``0001-01-01..9999-12-31``
    costs what the history holds, not a read minute by minute over ten thousand years."""
    if preset != CUSTOM:
        name = preset if preset in PRESETS else DEFAULT_RANGE
        return TimeRange(now - PRESETS[name], now, f"last {name}")
    if not start:
        raise RangeError("custom range: give a start time")
    t0 = _parse(start, "start")
    t1 = _parse(end, "end") if end else now
    if t1 <= t0:
        raise RangeError(f"custom range: the end ({minute_text(t1)}) is not after the start ({minute_text(t0)})")
    if t0 >= now:
        raise RangeError(f"custom range: the start ({minute_text(t0)}) is in the future")
    t1 = min(t1, now)
    earliest = history_start if history_start is not None else t1 - UNKNOWN_HISTORY_S
    if t1 <= earliest:
        raise RangeError(f"custom range: it ends before the stored history begins ({minute_text(earliest)})")
    t0 = max(t0, earliest)
    return TimeRange(t0, t1, f"{minute_text(t0)} to {minute_text(t1)}")


def _parse(text: str, what: str) -> float:
    try:
        return parse_timestamp(text)
    except ValueError:
        raise RangeError(f"custom range: the {what} {text[:40]!r} is not a time like 2026-01-01T00:20") from None
