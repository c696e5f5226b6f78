"""The metric catalogue: which GpuReading field becomes which Prometheus series, and the range of its values.

Data (``metriccatalogue.csv``), validated at import. Each field names its range, one of ``QUANTITIES``: the kind of
its values and the largest plausible one (the smallest is 0), in gpulens units. The ranges are kept here only: the
DCGM page reader (through ``gpulens.dcgmfields``) drops a value outside its field's range, and the collector
rejects a reading with a value above 1 in a ``ratio`` field.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Final, Literal

from gpulens.config import ConfigError
from gpulens.model import GpuReading

FAMILY_PREFIX: Final = "gpulens_gpu_"
GPU_LABELS: Final = ("node", "gpu", "uuid", "model")
_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_NUMERIC_TYPES: Final = ("int | None", "float | None", "bool | None")

Kind = Literal["float", "int", "bool"]


@dataclass(frozen=True, slots=True)
class Quantity:
    """The kind of a value and its largest plausible value (the smallest is 0), in gpulens units."""

    kind: Kind
    high: float


QUANTITIES: Final[Mapping[str, Quantity]] = {
    "ratio": Quantity("float", 1.0),
    "bytes": Quantity("int", float(2**50)),
    "celsius": Quantity("float", 200.0),
    "watts": Quantity("float", 10_000.0),
    "joules": Quantity("float", 1e15),
    "hertz": Quantity("float", 1e11),
    "bytes_per_second": Quantity("float", 1e13),
    "count": Quantity("int", float(2**63 - 1)),
    "pcie_generation": Quantity("int", 16.0),
    "pcie_lanes": Quantity("int", 64.0),
    "flag": Quantity("bool", 1.0),
    "seconds": Quantity("float", 1e10),  # a time counter since the driver loaded: 300 years
    "xid": Quantity("int", float(2**31 - 1)),  # an XID code (not a GpuReading field: DCGM's last XID)
}
_KIND_OF_TYPE: Final = {"float | None": "float", "int | None": "int", "bool | None": "bool"}


@dataclass(frozen=True, slots=True)
class FieldSpec:
    field: str
    family: str
    type: str  # "gauge" | "counter"
    range: str  # a key of QUANTITIES
    labels: tuple[tuple[str, str], ...]
    help: str

    @property
    def quantity(self) -> Quantity:
        return QUANTITIES[self.range]


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
        parts = [p.strip() for p in line.split(",", 5)]
        if len(parts) != 6:
            raise ConfigError("expected 6 comma-separated columns", file=source, line=lineno)
        name, family, kind, range_name, labels_text, help_text = parts

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
        if range_name not in QUANTITIES:
            raise fail(f"range must be one of {', '.join(QUANTITIES)}, not {range_name!r}", "range")
        if QUANTITIES[range_name].kind != _KIND_OF_TYPE[reading_fields[name]]:
            raise fail(
                f"range {range_name} holds {QUANTITIES[range_name].kind} values, {name} is {reading_fields[name]}",
                "range",
            )
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
        specs.append(FieldSpec(name, family, kind, range_name, tuple(labels), help_text))
    if not specs:
        raise ConfigError("the catalogue is empty", file=source)
    return tuple(specs)


def _load() -> tuple[FieldSpec, ...]:
    text = resources.files("gpulens").joinpath("metriccatalogue.csv").read_text(encoding="utf-8")
    return parse_catalogue(text)


GPU_FIELDS: Final[tuple[FieldSpec, ...]] = _load()
FIELD_BY_NAME: Final[dict[str, FieldSpec]] = {spec.field: spec for spec in GPU_FIELDS}


def fields_in(range_name: str) -> tuple[str, ...]:
    """The catalogue's fields whose range is ``range_name`` (``fields_in("ratio")``: every 0-1 field)."""
    return tuple(spec.field for spec in GPU_FIELDS if spec.range == range_name)
