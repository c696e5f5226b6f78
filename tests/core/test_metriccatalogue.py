from __future__ import annotations

import dataclasses

import pytest

from gpulens.config import ConfigError
from gpulens.metriccatalogue import GPU_FIELDS, QUANTITIES, fields_in, parse_catalogue
from gpulens.model import GpuReading

# Exported by dedicated code rather than the catalogue: identity, state, bitmask and per-code counters.
SPECIAL = {"node", "gpu", "uuid", "model", "timestamp", "up", "pci_bus_id", "driver_version", "mig_enabled"}
SPECIAL |= {"throttle_reasons", "throttle_reasons_source", "xid_errors"}


def test_every_numeric_reading_field_is_in_the_catalogue() -> None:
    fields = {f.name for f in dataclasses.fields(GpuReading)} - SPECIAL
    assert fields == {spec.field for spec in GPU_FIELDS}


def test_units_are_in_the_names() -> None:
    units = ("_bytes", "_ratio", "_celsius", "_watts", "_hertz", "_total", "_second", "_generation", "_width")
    for spec in GPU_FIELDS:
        if spec.family.endswith(("_active", "_rows", "_pending", "_failure", "_status", "_peers")):
            continue
        assert spec.family.endswith(units), spec.family


def test_each_field_names_its_range_once() -> None:
    """The ranges live in the catalogue: the 0-1 fields are the ``_ratio`` ones; each range has its field's kind."""
    assert set(fields_in("ratio")) == {spec.field for spec in GPU_FIELDS if spec.field.endswith("_ratio")}
    kinds = {"float": float, "int": int, "bool": bool}
    annotations = {f.name: str(f.type) for f in dataclasses.fields(GpuReading)}
    for spec in GPU_FIELDS:
        assert spec.quantity is QUANTITIES[spec.range]
        assert annotations[spec.field] == f"{kinds[spec.quantity.kind].__name__} | None", spec.field


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("bogus, gpulens_gpu_bogus, gauge, ratio, , help", "field"),
        ("node, gpulens_gpu_node, gauge, ratio, , help", "field"),
        ("power_watts, power, gauge, watts, , help", "family"),
        ("power_watts, gpulens_gpu_power_watts, histogram, watts, , help", "type"),
        ("power_watts, gpulens_gpu_power_watts_total, gauge, watts, , help", "family"),
        ("power_watts, gpulens_gpu_power_watts, gauge, watts, gpu=1, help", "labels"),
        ("power_watts, gpulens_gpu_power_watts, gauge, watts, , ", "help"),
        ("power_watts, gpulens_gpu_power_watts, gauge, kilowatts, , help", "range"),
        ("power_watts, gpulens_gpu_power_watts, gauge, count, , help", "range"),  # an int range for a float field
        ("power_watts, gpulens_gpu_power_watts, gauge, , , help", "range"),
        ("power_watts, gpulens_gpu_power_watts, gauge, , help", None),
    ],
)
def test_bad_catalogue_rows_name_the_line(line, key) -> None:
    text = "# comment\nutilization_ratio, gpulens_gpu_utilization_ratio, gauge, ratio, , ok\n" + line + "\n"
    with pytest.raises(ConfigError) as info:
        parse_catalogue(text, "cat.csv")
    assert info.value.line == 3
    assert info.value.file == "cat.csv"
    assert info.value.key == key
