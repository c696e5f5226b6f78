"""Readable tables for the terminal, and JSON rows for scripts."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from gpulens.config import format_timestamp

_NETWORK_RATES = frozenset({"rate_bytes_per_second", "transmit_bytes_per_second", "receive_bytes_per_second"})


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "-"
        if key in ("time", "timestamp", "first_seen", "last_seen", "start", "end", "since") or key.endswith("_at"):
            return format_timestamp(value)
        if key in _NETWORK_RATES:  # in bits, as links are sold: "400 Gb/s"
            return f"{value * 8 / 1e9:.4g} Gb/s"
        if key.endswith("_bytes"):
            return f"{value / 1024**3:.1f} GiB"
        if key.endswith("_ratio"):
            return f"{value * 100:.0f}%"
        return f"{value:.4g}"
    if isinstance(value, int) and key.endswith("_bytes"):
        return f"{value / 1024**3:.1f} GiB"
    return str(value)


def render_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Aligned columns with a header; an empty result says so."""
    if not rows:
        return "(no rows)\n"
    cols = list(columns or rows[0].keys())
    cells = [[_cell(c, row.get(c)) for c in cols] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines) + "\n"
