from __future__ import annotations

import json
import math

import pytest

from gpulens.model import THROTTLE_MASK, SnapshotFormatError, throttle_reason_names
from gpulens.snapshotcodec import snapshot_from_json, snapshot_to_json
from tests.fakes.static_source import h100, node_snapshot


def test_snapshot_json_round_trip_keeps_every_record() -> None:
    snap = node_snapshot(gpus=2)
    snap = snap.replace(gpus=(h100("node-00", 0, snap.timestamp, xid_errors={79: 1, 48: 2}), snap.gpus[1]))
    doc = json.loads(json.dumps(snapshot_to_json(snap, {"reason": "ok"})))
    assert doc["schema"] == 2
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
        (lambda d: d.update(schema=3), "schema"),
        (lambda d: d.update(nics=[{"device": "mlx5_0"}]), "port"),
        (lambda d: d.update(nics=[{"device": "mlx5_0", "port": 1, "gpus": ["0"]}]), "gpus"),
        (lambda d: d.update(host={"cpu_busy_ratio": "high"}), "cpu_busy_ratio"),
        (lambda d: d.update(host={"jobs": [{"cpu_used_cores": 1.0}]}), "job_id"),
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


def test_schema_2_carries_nics_and_host_and_schema_1_still_reads() -> None:
    from gpulens.fabricmodel import HostReading, JobHostReading, NicReading

    snap = node_snapshot(gpus=2).replace(
        nics=(
            NicReading(
                node="node-00",
                device="mlx5_0",
                port=1,
                link_layer="InfiniBand",
                up=True,
                rate_bytes_per_second=50e9,
                transmit_bytes_total=4096,
                transmit_bytes_per_second=1e9,
                saturated_counters=("symbol_errors_total",),
                gpus=(0, 1),
            ),
        ),
        host=HostReading(node="node-00", cpus=64, cpu_busy_ratio=0.25, memory_available_bytes=2**30),
        job_hosts=(JobHostReading(node="node-00", job_id="77", cpu_seconds_total=12.5, cpu_used_cores=3.0),),
    )
    doc = json.loads(json.dumps(snapshot_to_json(snap)))
    assert "node" not in doc["nics"][0]
    assert doc["nics"][0]["gpus"] == [0, 1]
    assert doc["host"]["jobs"] == [{"job_id": "77", "cpu_seconds_total": 12.5, "cpu_used_cores": 3.0}]
    back = snapshot_from_json(doc)
    assert back.nics == snap.nics
    assert back.host == snap.host
    assert back.job_hosts == snap.job_hosts
    old = {k: v for k, v in doc.items() if k not in ("nics", "host")} | {"schema": 1}
    old_back = snapshot_from_json(old)
    assert old_back.gpus == snap.gpus
    assert old_back.nics == ()
    assert old_back.host is None


def test_nic_id_round_trips() -> None:
    from gpulens.fabricmodel import NicReading, nic_id, parse_nic_id

    assert (
        NicReading(node="node-03", device="mlx5_2", port=1).id == nic_id("node-03", "mlx5_2", 1) == "node-03/mlx5_2/1"
    )
    assert parse_nic_id("node-03/mlx5_2/1") == ("node-03", "mlx5_2", 1)
    assert parse_nic_id("mlx5_2/1") is None
    assert parse_nic_id("a/b/c") is None
