"""The DCGM field table (gpulens.dcgmfields): one row per field id, read and written with the same names and units."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from gpulens.dcgmfields import BY_NAME, COMPAT_FIELDS, FIELDS, FREE, MEM_COPY, NVLINK_TOTAL, XID_TARGET, compat_value
from gpulens.dcgmpage import parse_dcgm_metrics
from tests.fakes.static_source import h100

HEADER_CSV = Path(__file__).parents[1] / "fixtures" / "dcgm" / "dcgm_fields_4.6.csv"


def _header_rows() -> list[dict[str, str]]:
    lines = [line for line in HEADER_CSV.read_text().splitlines() if not line.startswith("#")]
    return list(csv.DictReader(lines))


def test_every_name_and_field_id_belongs_to_one_row() -> None:
    names = [name.name for row in FIELDS for name in row.names]
    assert len(names) == len(set(names)) == len(BY_NAME)
    ids = [row.field_id for row in FIELDS]
    assert len(ids) == len(set(ids))


def test_every_dcgm_name_in_the_table_is_dcgm_46s_with_its_id_and_unit() -> None:
    """Held to dcgm_fields.h 4.6 (the fixture cites it): the right id, the right unit, current name vs alias."""
    header = {row["name"]: row for row in _header_rows()}
    table = {name.name: (row, name.generation) for row in FIELDS for name in row.names if name.generation != "old"}
    assert set(table) == set(header)
    for name, (row, generation) in table.items():
        expected = header[name]
        assert (row.field_id, row.unit, generation) == (
            int(expected["field_id"]),
            expected["unit"],
            expected["kind"],
        ), name


@pytest.mark.parametrize(
    ("name", "field_id"),
    [
        ("DCGM_FI_DEV_GPU_UTIL_RATIO", 203),
        ("DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS", 164),
        ("DCGM_FI_DEV_BOARD_POWER_LIMIT_REQUESTED_WATTS", 160),
        ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL", 409),
        ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL", 429),
        ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL", 439),
        ("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", 1001),
        ("DCGM_FI_DEV_MEM_COPY_UTIL", 204),
    ],
)
def test_names_from_the_issue(name: str, field_id: int) -> None:
    assert BY_NAME[name].field.field_id == field_id
    assert BY_NAME[name].name.generation == "current"


def test_names_in_no_header_are_gone_and_the_deprecated_power_limit_is_an_alias() -> None:
    for name in ("DCGM_FI_DEV_FB_USED_BYTES", "DCGM_FI_DEV_SM_CLOCK_HERTZ", "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL"):
        assert name not in BY_NAME
    assert BY_NAME["DCGM_FI_DEV_ENFORCED_POWER_LIMIT"].name.generation == "alias"
    # GPU_UTIL_RATIO still holds 0-100: 91 % is 0.91, not dropped; 1 % is 0.01, not 100 %
    assert BY_NAME["DCGM_FI_DEV_GPU_UTIL_RATIO"].field.divide == 100


def test_old_namespace_names_map_to_the_same_fields() -> None:
    for old, current in [
        ("dcgm_gpu_utilization", "DCGM_FI_DEV_GPU_UTIL_RATIO"),
        ("dcgm_fb_used", "DCGM_FI_DEV_FB_USED"),
        ("dcgm_gpu_temp", "DCGM_FI_DEV_GPU_TEMP_CELSIUS"),
        ("dcgm_power_usage", "DCGM_FI_DEV_BOARD_POWER_WATTS"),
        ("dcgm_fi_prof_gr_engine_active", "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO"),
    ]:
        assert BY_NAME[old].field is BY_NAME[current].field, old
        assert BY_NAME[old].name.generation == "old"


def test_what_dcgm_compat_writes_reads_back_as_the_same_reading() -> None:
    """Written under each compat row's name and unit, a reading parses back to itself."""
    reading = h100("node-00", 3, 0.0, sm_clock_hertz=1.755e9, energy_joules_total=123_456.789)
    labels = f'gpu="3",UUID="{reading.uuid}",modelName="{reading.model}"'
    page = "".join(
        f"{row.compat_name}{{{labels}}} {value!r}\n"
        for row in COMPAT_FIELDS
        if (value := compat_value(row, reading, {reading.uuid: 79})) is not None
    )
    parsed = parse_dcgm_metrics(page, node="node-00", timestamp=0.0)
    (back,) = parsed.gpus
    assert parsed.error_counts() == {}
    assert parsed.last_xid == {reading.uuid: 79}
    written = {row.target for row in COMPAT_FIELDS if compat_value(row, reading, {}) is not None}
    written -= {FREE, NVLINK_TOTAL, XID_TARGET, MEM_COPY}
    assert len(written) == 24  # with the video encoder and decoder
    for target in sorted(written):
        assert getattr(back, target) == pytest.approx(getattr(reading, target), rel=1e-12), target
    # Free memory is derived on the way out; on the way in, used + free + reserved is the total.
    assert back.memory_total_bytes == reading.memory_total_bytes
