"""Grafana's template variables, substituted into a panel's PromQL as Grafana does before it queries Prometheus.

What Grafana substitutes (its Prometheus data source, "query" variables with ``multi`` and ``includeAll``):

- ``$var``, ``${var}``: "All" becomes the variable's ``allValue`` (``.*``); one or more chosen values become
  ``(a|b)``, each value escaped for a regular expression (the dashboard matches them with ``=~``).
- ``${datasource}``: the data source's uid (not part of a query's text).
- ``$__interval``: the time range over the panel's data points (about its width in pixels), rounded to Grafana's
  steps (``roundInterval``: ... 10s, 15s, 20s, 30s, 1m, 2m, 5m ...) and at least the data source's scrape interval.
- ``$__rate_interval``: ``max($__interval + scrape interval, 4 x scrape interval)``.
- ``$__range``, ``$__range_s``, ``$__range_ms``: the dashboard's time range, as ``21600s``, ``21600``, ``21600000``.

Anything else starting with ``$`` is left in place, so a test finds it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Grafana's rounding of an interval (upper bound of the raw interval in ms -> the interval used, ms), from 1 s up.
_ROUNDING_MS = (
    (1_500, 1_000),
    (3_500, 2_000),
    (7_500, 5_000),
    (12_500, 10_000),
    (17_500, 15_000),
    (25_000, 20_000),
    (45_000, 30_000),
    (90_000, 60_000),
    (210_000, 120_000),
    (450_000, 300_000),
    (750_000, 600_000),
    (1_050_000, 900_000),
    (1_500_000, 1_200_000),
    (2_700_000, 1_800_000),
    (5_400_000, 3_600_000),
    (9_000_000, 7_200_000),
    (16_200_000, 10_800_000),
    (32_400_000, 21_600_000),
    (86_400_000, 43_200_000),
)
_RANGE = re.compile(r"^now-(\d+)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_REGEX_SPECIAL = re.compile(r"[\\^$*+?.()|{}\[\]]")
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


@dataclass(frozen=True)
class View:
    """What Grafana knows when it draws a panel."""

    range_s: int  # the dashboard's time range
    scrape_interval_s: int  # the data source's "scrape interval" setting
    data_points: int = 1000  # a half-width panel on a 1920-pixel screen is about 950 pixels wide
    chosen: Mapping[str, Sequence[str]] = field(default_factory=dict)  # variable -> values; absent: "All"


def range_of(dashboard: Mapping[str, Any]) -> int:
    """The dashboard's default time range in seconds (``"from": "now-6h", "to": "now"``)."""
    found = _RANGE.match(dashboard["time"]["from"])
    assert found, dashboard["time"]
    assert dashboard["time"]["to"] == "now", dashboard["time"]
    return int(found.group(1)) * _UNIT_S[found.group(2)]


def interval_s(view: View) -> int:
    raw_ms = view.range_s * 1000 / view.data_points
    rounded = next((ms for bound, ms in _ROUNDING_MS if raw_ms < bound), 86_400_000)
    return max(rounded // 1000, view.scrape_interval_s)


def rate_interval_s(view: View) -> int:
    return max(interval_s(view) + view.scrape_interval_s, 4 * view.scrape_interval_s)


def _regex_escape(value: str) -> str:
    """A value as Grafana writes it inside ``=~"..."``: regex metacharacters escaped, the backslash doubled for the
    PromQL string."""
    return _REGEX_SPECIAL.sub(lambda m: "\\\\" + m.group(0), value)


def resolve(expr: str, dashboard: Mapping[str, Any], view: View) -> str:
    """``expr`` with every variable Grafana would substitute substituted."""
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    builtins = {
        "__interval": f"{interval_s(view)}s",
        "__rate_interval": f"{rate_interval_s(view)}s",
        "__range": f"{view.range_s}s",
        "__range_s": str(view.range_s),
        "__range_ms": str(view.range_s * 1000),
    }

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name in builtins:
            return builtins[name]
        variable = variables.get(name)
        if variable is None or variable["type"] != "query":
            return match.group(0)
        chosen = view.chosen.get(name)
        if chosen is None:
            return str(variable["allValue"])
        return "(" + "|".join(_regex_escape(v) for v in chosen) + ")"

    return _VARIABLE.sub(value, expr)
