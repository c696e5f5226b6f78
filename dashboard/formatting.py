"""Formatting: how the dashboard writes a value for a person (bytes, rates, watts, degrees, percentages, durations,
GPU names), and rounding that keeps figure JSON small. A value that was not read shows as ``MISSING``.
"""

from __future__ import annotations

import html
import math
from typing import Final

MISSING: Final = "\u2013"  # what a table or card shows for a value that was not read


def plotly_text(value: object) -> str:
    """A value a target or a job chose (node, model, UUID, job, user, device) for Plotly's hover and cell text, which
    read a subset of HTML: escaped, so it shows as written and never as markup."""
    return html.escape(str(value), quote=False)


def round_sig(value: float | None, digits: int = 4) -> float | None:
    """``value`` to ``digits`` significant digits (smaller JSON); ``None`` and non-finite values become ``None``."""
    if value is None or not math.isfinite(value):
        return None
    if value == 0:
        return 0.0
    return round(value, digits - 1 - math.floor(math.log10(abs(value))))


def percent_text(ratio: float | None) -> str:
    return MISSING if ratio is None else f"{ratio * 100:.0f}%"


def bytes_text(value: float | None) -> str:
    """Memory sizes in binary units, as nvidia-smi shows them."""
    if value is None:
        return MISSING
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(value) >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:.0f} B"


def rate_text(value: float | None) -> str:
    """Throughput in decimal units, as link datasheets give it."""
    if value is None:
        return MISSING
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:.0f} B/s"


def watts_text(value: float | None) -> str:
    if value is None:
        return MISSING
    return f"{value / 1000:.1f} kW" if value >= 10_000 else f"{value:.0f} W"


def celsius_text(value: float | None) -> str:
    return MISSING if value is None else f"{value:.0f} °C"


def duration_text(seconds: float | None) -> str:
    """``3d 4h``, ``2h 05m``, ``7m``, ``40s``."""
    if seconds is None:
        return MISSING
    s = max(0, int(seconds))
    if s >= 86400:
        return f"{s // 86400}d {s % 86400 // 3600}h"
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m"
    return f"{s}s"


def gpu_label(node: str, index: int) -> str:
    """``node-01:3``: how a person names a GPU."""
    return f"{node}:{index}"
