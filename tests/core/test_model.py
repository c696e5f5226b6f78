from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from typing import Any

import pytest

from gpulens.model import THROTTLE_MASK, GpuReading, NodeSnapshot, SnapshotFormatError, throttle_reason_names
from gpulens.snapshotcodec import (
    LAYOUT_COLUMNAR,
    SnapshotNotJSONError,
    snapshot_from_bytes,
    snapshot_from_json,
    snapshot_to_bytes,
    snapshot_to_json,
)
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
def test_malformed_snapshot_is_rejected_with_the_field(mutate: Callable[[Any], object], message: str) -> None:
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


def _full_snapshot() -> NodeSnapshot:
    """Every section filled: GPUs (one with XIDs), links, processes, jobs, a MIG, a NIC, the host and a job's share."""
    from gpulens.fabricmodel import HostReading, JobHostReading, NicReading
    from gpulens.model import MigReading

    snap = node_snapshot(gpus=2)
    gpu0 = h100("node-00", 0, snap.timestamp, xid_errors={79: 1, 48: 2})
    return snap.replace(
        gpus=(gpu0, snap.gpus[1]),
        migs=(MigReading(node="node-00", gpu=1, uuid=snap.gpus[1].uuid, mig_uuid="MIG-1", gpu_instance_id=3),),
        nics=(
            NicReading(
                node="node-00",
                device="mlx5_0",
                port=1,
                up=True,
                rate_bytes_per_second=50e9,
                saturated_counters=("symbol_errors_total",),
                gpus=(0, 1),
            ),
        ),
        host=HostReading(node="node-00", cpus=64, cpu_busy_ratio=0.25),
        job_hosts=(JobHostReading(node="node-00", job_id="77", cpu_used_cores=3.0),),
        errors={"nvml_not_supported": 3},
    )


@pytest.mark.parametrize("layout", ["rows", "columnar"])
def test_both_layouts_round_trip_every_section(layout: str) -> None:
    snap = _full_snapshot()
    assert snap.links
    assert snap.processes
    assert snap.jobs
    text = snapshot_to_bytes(snap, {"reason": "ok"}, layout=layout)
    doc = json.loads(text)
    assert doc["layout"] == layout
    assert snapshot_from_bytes(text) == snap
    assert snapshot_from_json(doc) == snap


def test_the_columnar_layout_is_tables_without_the_node() -> None:
    doc = snapshot_to_json(_full_snapshot(), layout=LAYOUT_COLUMNAR)
    for section in ("gpus", "links", "processes", "jobs", "migs", "nics"):
        assert set(doc[section]) == {"columns", "rows"}, section
        assert "node" not in doc[section]["columns"]
        assert all(len(row) == len(doc[section]["columns"]) for row in doc[section]["rows"])
    assert "uuid" not in doc["links"]["columns"]
    assert len(doc["gpus"]["rows"]) == 2


# "class" reads like a field name but, a Python keyword, can never become one (a real future field would turn this
# test into a check of that field instead).
@pytest.mark.parametrize("column", ["class", "fan speed", "", "__init__", "replace", "1st"])
def test_a_column_this_reader_does_not_know_is_ignored(column: str) -> None:
    assert column not in {f.name for f in dataclasses.fields(GpuReading)}
    snap = _full_snapshot()
    doc = json.loads(snapshot_to_bytes(snap, layout=LAYOUT_COLUMNAR))
    doc["gpus"]["columns"].append(column)  # what a newer (or a broken) exporter might add
    for row in doc["gpus"]["rows"]:
        row.append(0.4)
    assert snapshot_from_json(doc).gpus == snap.gpus


def _columnar_cell(doc: dict[str, Any], section: str, column: str, value: object) -> None:
    doc[section]["rows"][0][doc[section]["columns"].index(column)] = value


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: _columnar_cell(d, "gpus", "memory_used_bytes", "lots"), r"gpus\[0\]\.memory_used_bytes"),
        (lambda d: _columnar_cell(d, "gpus", "utilization_ratio", True), "utilization_ratio"),
        (lambda d: _columnar_cell(d, "gpus", "xid_errors", {"seventy": 1}), "xid_errors"),
        (lambda d: _columnar_cell(d, "links", "active", "yes"), r"links\[0\]\.active"),
        (lambda d: _columnar_cell(d, "links", "gpu", 7), "GPU 7 is not among"),
        (lambda d: _columnar_cell(d, "nics", "gpus", ["0"]), r"nics\[0\]\.gpus"),
        (lambda d: _columnar_cell(d, "processes", "pid", None), r"processes\[0\]\.pid"),
        (lambda d: d["gpus"]["rows"][0].append(1), "expected rows of"),
        (lambda d: d["gpus"]["rows"][0].pop(), r"gpus\[0\]"),
        (lambda d: d["gpus"].update(columns=[c for c in d["gpus"]["columns"] if c != "uuid"]), "uuid"),
        (lambda d: d["jobs"]["columns"].append("job_id"), "twice"),
        (lambda d: d.update(gpus=[]), "gpus: expected a table"),
        (lambda d: d.update(layout="packed"), "layout"),
        (lambda d: d["gpus"].pop("columns"), "columns"),
    ],
)
def test_malformed_columnar_snapshot_is_rejected_with_the_field(mutate: Callable[[Any], object], message: str) -> None:
    doc = json.loads(snapshot_to_bytes(_full_snapshot(), layout=LAYOUT_COLUMNAR))
    mutate(doc)
    with pytest.raises(SnapshotFormatError, match=message):
        snapshot_from_json(doc)


def test_a_table_in_the_row_layout_is_rejected() -> None:
    doc = snapshot_to_json(_full_snapshot())
    doc["gpus"] = snapshot_to_json(_full_snapshot(), layout=LAYOUT_COLUMNAR)["gpus"]
    with pytest.raises(SnapshotFormatError, match="gpus: expected an array in the rows layout"):
        snapshot_from_json(doc)


@pytest.mark.parametrize(
    ("text", "error", "message"),
    [
        (b'{"schema": 2, "node": "n", "ti', SnapshotNotJSONError, "truncated"),
        (b"\xff\x00", SnapshotNotJSONError, "malformed"),
        (b"[1, 2]", SnapshotFormatError, "expected `object`"),
        (b'{"schema": 2, "node": "n", "time": 1e999}', SnapshotFormatError, "time"),
        (b'{"schema": 7, "node": 1}', SnapshotFormatError, "unsupported schema 7"),
        (b'{"schema": 2, "time": 1.0}', SnapshotFormatError, "node"),
        (
            b'{"schema": 2, "node": "n", "time": 1.0, "links": [[0, 0, true, 1.0, 2.0, null]]}',
            SnapshotFormatError,
            "link_columns",
        ),
    ],
)
def test_bad_json_text_is_rejected_with_what_is_wrong(text: bytes, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        snapshot_from_bytes(text)


def test_the_row_layout_link_rows_keep_their_width() -> None:
    doc = snapshot_to_json(node_snapshot(gpus=1))
    doc["links"][0] = [*doc["links"][0], "extra"]
    with pytest.raises(SnapshotFormatError, match="links\\[0\\]: expected rows of 6 values"):
        snapshot_from_json(doc)
