"""The DCGM field table (gpulens.dcgmfields): one row per field, read and written with the same names and units."""

from __future__ import annotations

import pytest

from gpulens.dcgmfields import BY_NAME, COMPAT_FIELDS, FIELDS, FREE, NVLINK_TOTAL, XID_TARGET, compat_value
from gpulens.dcgmpage import parse_dcgm_metrics
from tests.fakes.static_source import h100


def test_every_name_and_field_id_belongs_to_one_row() -> None:
    names = [name.name for row in FIELDS for name in row.names]
    assert len(names) == len(set(names)) == len(BY_NAME)
    ids = [row.field_id for row in FIELDS]
    assert len(ids) == len(set(ids))
    assert all(row.legacy or row.base for row in FIELDS)


def test_base_unit_names_carry_no_conversion_and_outrank_their_legacy_names() -> None:
    for row in FIELDS:
        for base in row.base:
            assert (base.multiply, base.divide) == (1, 1), base.name
            assert all(base.rank > legacy.rank for legacy in row.legacy), base.name


def test_what_dcgm_compat_writes_reads_back_as_the_same_reading() -> None:
    """Written under each compat row's legacy name and unit, a reading parses back to itself."""
    reading = h100("node-00", 3, 0.0, sm_clock_hertz=1.755e9, energy_joules_total=123_456.789)
    labels = f'gpu="3",UUID="{reading.uuid}",modelName="{reading.model}"'
    page = "".join(
        f"{row.legacy[0].name}{{{labels}}} {compat_value(row, reading, {reading.uuid: 79})!r}\n"
        for row in COMPAT_FIELDS
    )
    parsed = parse_dcgm_metrics(page, node="node-00", timestamp=0.0)
    (back,) = parsed.gpus
    assert parsed.error_counts() == {}
    assert parsed.last_xid == {reading.uuid: 79}
    written = {row.target for row in COMPAT_FIELDS} - {FREE, NVLINK_TOTAL, XID_TARGET}
    assert len(written) == 18
    for target in sorted(written):
        assert getattr(back, target) == pytest.approx(getattr(reading, target), rel=1e-12), target
    # Free memory is derived on the way out; on the way in, used + free (+ reserved, not written) is the total.
    assert back.memory_total_bytes == reading.memory_total_bytes - (reading.memory_reserved_bytes or 0)
