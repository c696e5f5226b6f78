from __future__ import annotations

import json
import math

import pytest

from gpulens.model import (
    THROTTLE_MASK,
    SnapshotFormatError,
    snapshot_from_json,
    snapshot_to_json,
    throttle_reason_names,
)
from tests.fakes.static_source import h100, node_snapshot


def test_snapshot_json_round_trip_keeps_every_record() -> None:
    snap = node_snapshot(gpus=2)
    snap = snap.replace(gpus=(h100("node-00", 0, snap.timestamp, xid_errors={79: 1, 48: 2}), snap.gpus[1]))
    doc = json.loads(json.dumps(snapshot_to_json(snap, {"reason": "ok"})))
    assert doc["schema"] == 1
    assert doc["exporter"] == {"reason": "ok"}
    back = snapshot_from_json(doc)
    assert back.gpus == snap.gpus
    assert back.links == snap.links
    assert back.processes == snap.processes
    assert back.jobs == snap.jobs
    assert back.gpus[0].xid_errors == {79: 1, 48: 2}


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(schema=2), "schema"),
        (lambda d: d["gpus"][0].update(memory_used_bytes="lots"), "memory_used_bytes"),
        (lambda d: d["gpus"][0].update(utilization_ratio=True), "utilization_ratio"),
        (lambda d: d["gpus"][0].pop("uuid"), "uuid"),
        (lambda d: d["gpus"][0].update(memory_used_bytes=1.5), "memory_used_bytes"),
        (lambda d: d.update(gpus={}), "gpus"),
        (lambda d: d.update(errors={"x": "y"}), "errors"),
        (lambda d: d["gpus"][0].update(xid_errors={"seventy": 1}), "xid_errors"),
    ],
)
def test_malformed_snapshot_is_rejected_with_the_field(mutate, message) -> None:
    doc = json.loads(json.dumps(snapshot_to_json(node_snapshot(gpus=1))))
    mutate(doc)
    with pytest.raises(SnapshotFormatError, match=message):
        snapshot_from_json(doc)


def test_non_finite_numbers_are_rejected() -> None:
    doc = snapshot_to_json(node_snapshot(gpus=1))
    doc["gpus"][0]["power_watts"] = math.nan
    with pytest.raises(SnapshotFormatError, match="power_watts"):
        snapshot_from_json(doc)


def test_throttle_reason_names_decode_the_nvml_bits() -> None:
    assert throttle_reason_names(0x4 | 0x20) == ["sw_power_cap", "sw_thermal"]
    assert throttle_reason_names(0) == []
    assert len(throttle_reason_names(THROTTLE_MASK)) == 9


def test_old_process_memory_key_is_read_and_the_new_one_written() -> None:
    doc = json.loads(json.dumps(snapshot_to_json(node_snapshot(gpus=1))))
    [process] = doc["processes"]
    assert "memory_used_bytes" in process
    assert "used_memory_bytes" not in process
    process["used_memory_bytes"] = process.pop("memory_used_bytes")  # what exporters before the rename wrote
    [back] = snapshot_from_json(doc).processes
    assert back.memory_used_bytes == process["used_memory_bytes"]
    assert back.memory_used_bytes is not None
