"""The partial Plotly bundle the dashboard loads (``assets/vendor``): it draws every trace type the figures use, and
it is the plotly.js major version that the installed plotly (Python) writes figures for."""

from __future__ import annotations

import re
from pathlib import Path

import plotly

from gpulens import dashboard
from gpulens.dashboard.app import ASSETS, PLOTLY_BUNDLE

_VERSION = re.compile(r"plotly\.js (?:\([\w -]+\) )?v(\d+)\.(\d+)\.(\d+)")


def _bundle() -> str:
    return (ASSETS / PLOTLY_BUNDLE).read_text(encoding="utf-8")


def test_the_bundle_draws_every_trace_type_the_figures_use() -> None:
    traces = set(re.findall(r'moduleType:"trace",name:"(\w+)"', _bundle()))
    assert {"scatter", "heatmap"} <= traces
    used: set[str] = set()
    for path in Path(dashboard.__file__).parent.rglob("*.py"):
        used |= {name.lower() for name in re.findall(r"\bgo\.(\w+)\(", path.read_text()) if name != "Figure"}
    assert used, "no trace found: the scan is broken"
    assert used <= traces, f"not in {PLOTLY_BUNDLE}: {sorted(used - traces)}"


def test_the_bundle_matches_the_plotly_js_major_version_of_plotly() -> None:
    full = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    ours, theirs = _VERSION.search(_bundle()[:300]), _VERSION.search(full.read_text(encoding="utf-8")[:300])
    assert ours is not None
    assert theirs is not None
    assert ours.group(1) == theirs.group(1), (ours.group(0), theirs.group(0))
    assert PLOTLY_BUNDLE.endswith(f"-{'.'.join(ours.groups())}.min.js")
