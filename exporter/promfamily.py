"""Prometheus text families written directly: label escaping, sample formatting and one family's HELP/TYPE/samples.

Used by ``exporter.metrics`` (GPU families) and ``gpulens.exporter.fabricmetrics`` (fabric and host families) instead of
prometheus_client's generic writer, which re-validates and re-escapes every label of every sample: a label set is
escaped once here and reused by every series that carries it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_labels(names: Sequence[str], values: Sequence[str]) -> str:
    return ",".join(f'{n}="{escape_label(v)}"' for n, v in zip(names, values, strict=True))


def _format(value: float | int | bool) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isfinite(value):
        return repr(float(value))
    return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")


class Family:
    """One metric family being rendered: its HELP and TYPE lines and its samples."""

    __slots__ = ("help", "label_names", "name", "samples", "type")

    def __init__(self, name: str, help: str, labels: Sequence[str] = (), *, type: str = "gauge") -> None:
        self.name = name
        self.help = help
        self.type = type
        self.label_names = tuple(labels)
        self.samples: list[str] = []

    def add_metric(self, values: Sequence[str], value: float | int | bool) -> None:
        self.add_rendered(render_labels(self.label_names, values), value)

    def add_rendered(self, labels: str, value: float | int | bool) -> None:
        """Add a sample whose label text (``a="x",b="y"``) is already escaped."""
        self.samples.append(
            f"{self.name}{{{labels}}} {_format(value)}\n" if labels else f"{self.name} {_format(value)}\n"
        )

    def render(self) -> str:
        if not self.samples:
            return ""
        help_text = self.help.replace("\\", "\\\\").replace("\n", "\\n")
        return f"# HELP {self.name} {help_text}\n# TYPE {self.name} {self.type}\n" + "".join(self.samples)
