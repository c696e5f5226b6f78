"""The metric catalogue: which GpuReading field becomes which Prometheus series. Data, validated at import."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from importlib import resources
from typing import Final

from gpulens.config import ConfigError
from gpulens.model import GpuReading

FAMILY_PREFIX: Final = "gpulens_gpu_"
GPU_LABELS: Final = ("node", "gpu", "uuid", "model")
_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_NUMERIC_TYPES: Final = ("int | None", "float | None", "bool | None")


@dataclass(frozen=True, slots=True)
class FieldSpec:
    field: str
    family: str
    type: str  # "gauge" | "counter"
    labels: tuple[tuple[str, str], ...]
    help: str


def parse_catalogue(text: str, source: str = "metriccatalogue.csv") -> tuple[FieldSpec, ...]:
    """Parse and validate catalogue text; errors name the file and the line."""
    reading_fields = {f.name: str(f.type) for f in dataclasses.fields(GpuReading)}
    specs: list[FieldSpec] = []
    seen_fields: set[str] = set()
    family_types: dict[str, str] = {}
    family_label_keys: dict[str, tuple[str, ...]] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",", 4)]
        if len(parts) != 5:
            raise ConfigError("expected 5 comma-separated columns", file=source, line=lineno)
        name, family, kind, labels_text, help_text = parts

        def fail(message: str, key: str, line: int = lineno) -> ConfigError:
            return ConfigError(message, file=source, key=key, line=line)

        if name not in reading_fields:
            raise fail(f"{name!r} is not a GpuReading field", "field")
        if reading_fields[name] not in _NUMERIC_TYPES:
            raise fail(f"{name!r} is not a numeric field", "field")
        if name in seen_fields:
            raise fail(f"{name!r} is listed twice", "field")
        if not family.startswith(FAMILY_PREFIX) or not _NAME.match(family):
            raise fail(f"{family!r} must be a metric name starting with {FAMILY_PREFIX}", "family")
        if kind not in ("gauge", "counter"):
            raise fail(f"type must be gauge or counter, not {kind!r}", "type")
        if (kind == "counter") != family.endswith("_total"):
            raise fail("counters, and only counters, end in _total", "family")
        if family_types.setdefault(family, kind) != kind:
            raise fail(f"{family} is declared with two types", "type")
        labels: list[tuple[str, str]] = []
        for pair in filter(None, (p.strip() for p in labels_text.split(";"))):
            key, sep, value = pair.partition("=")
            if not sep or not _NAME.match(key) or key in GPU_LABELS or not value:
                raise fail(f"bad label {pair!r} (want key=value, not one of {', '.join(GPU_LABELS)})", "labels")
            labels.append((key, value))
        keys = tuple(k for k, _ in labels)
        if family_label_keys.setdefault(family, keys) != keys:
            raise fail(f"{family} rows disagree on their label names", "labels")
        if not help_text:
            raise fail("help text is empty", "help")
        seen_fields.add(name)
        specs.append(FieldSpec(name, family, kind, tuple(labels), help_text))
    if not specs:
        raise ConfigError("the catalogue is empty", file=source)
    return tuple(specs)


def _load() -> tuple[FieldSpec, ...]:
    text = resources.files("gpulens").joinpath("metriccatalogue.csv").read_text(encoding="utf-8")
    return parse_catalogue(text)


GPU_FIELDS: Final[tuple[FieldSpec, ...]] = _load()
FIELD_BY_NAME: Final[dict[str, FieldSpec]] = {spec.field: spec for spec in GPU_FIELDS}
