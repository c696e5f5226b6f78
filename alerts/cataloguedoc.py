"""The catalogue as a table: docs/alerts.md's table of rules and ``gpulens rules list`` print the same rows.

Each row is one builtin as configured: its severity, ``for``, ``keep_firing_for``, thresholds and where it runs (the
engine alone, or also as an exported Prometheus rule). A test holds docs/alerts.md to ``markdown_table()`` of the
defaults, so the docs cannot drift from the catalogue.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gpulens.alerts.base import AlertRule, Threshold
from gpulens.alerts.catalogue import GPULENS_ONLY
from gpulens.alerts.promql import duration

HEADER = ("alert", "severity", "`for`", "`keep_firing_for`", "default thresholds", "runs in")


def _number(value: float) -> str:
    """``0.95``, ``1000``, ``25e9``: large values in engineering notation, as a config file would write them."""
    if abs(value) >= 1e6 and value == int(value):
        exponent = int(math.log10(abs(value))) // 3 * 3
        return f"{value / 10**exponent:g}e{exponent}"
    return f"{value:g}"


def threshold_text(name: str, value: Threshold) -> str:
    """``used_ratio` 0.95``, ``codes` [48, 79]``, ``window_s` 600 (10m)``."""
    if isinstance(value, tuple):
        return f"`{name}` [{', '.join(_number(v) for v in value)}]"
    text = f"`{name}` {_number(value)}"
    if (name.endswith("_s") or name.endswith("_for")) and value >= 60:
        text += f" ({duration(value)})"
    return text


def _duration_cell(seconds: float) -> str:
    return duration(seconds) if seconds else "0"


def where(rule: AlertRule) -> str:
    """``engine, Prometheus`` or ``engine only``: whether ``rules export`` says the rule in PromQL."""
    return "engine only" if (rule.check or rule.name) in GPULENS_ONLY else "engine, Prometheus"


def rows(rules: Sequence[AlertRule]) -> list[tuple[str, ...]]:
    return [
        (
            f"`{r.name}`",
            r.severity,
            _duration_cell(r.for_s),
            _duration_cell(r.keep_firing_for_s),
            ", ".join(threshold_text(k, v) for k, v in r.thresholds.items()) or "—",
            where(r),
        )
        for r in rules
    ]


def markdown_table(rules: Sequence[AlertRule]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in rows(rules)]
    return "\n".join(lines) + "\n"
