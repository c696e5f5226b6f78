"""One hostile target beside a healthy one: values storage cannot hold never cost the healthy target its rounds.

Real collector rounds over HTTP on 127.0.0.1 into SQLite and PostgreSQL (the ``db_url`` fixture runs both): a
dcgm-exporter page with GPU index 40000 and counters past their columns (1e19, 5e9), and a gpulens exporter whose
snapshot carries a JSON value of 2**63, a GPU index of 40000 and a pid of 2**63. Each bad value is dropped alone at
the door and counted; every round of the healthy target is stored.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from gpulens.collector.loop import Collector
from gpulens.model import ProcessReading
from gpulens.settings import TargetSettings, default_settings
from gpulens.snapshotcodec import snapshot_to_json
from gpulens.storage.db import Database
from tests.collector.live import live_exporter
from tests.fakes.dcgm_server import stand_in_dcgm_exporter
from tests.fakes.static_source import node_snapshot

ROUNDS = 4
BAD = 'UUID="GPU-bad-{i}",modelName="NVIDIA H100 80GB HBM3",Hostname="hostile-dcgm"'
DCGM_PAGE = "".join(
    line + "\n"
    for line in (
        f'DCGM_FI_DEV_GPU_TEMP{{gpu="40000",{BAD.format(i=9)}}} 40',  # an index smallint cannot hold
        f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",{BAD.format(i=0)}}} 41',
        f'DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{gpu="0",{BAD.format(i=0)}}} 1e19',  # past int64: DCGM's blank
        f'DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{{gpu="0",{BAD.format(i=0)}}} 5e9',  # past the integer column
    )
)


def hostile_snapshot() -> bytes:
    base = node_snapshot("hostile-json", gpus=2, t=round(time.time(), 3))
    first, second = base.gpus
    gpus = (dataclasses.replace(first, pcie_replays_total=2**63), dataclasses.replace(second, gpu=40000))
    process = ProcessReading("hostile-json", 0, first.uuid, 2**63, 1024, "python", "mallory", None)
    hostile = base.replace(gpus=gpus, processes=(process,), links=(), jobs=(), migs=())
    return json.dumps(snapshot_to_json(hostile)).encode()


def test_a_hostile_target_never_costs_a_healthy_one_its_rounds(
    db_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gpulens.collector.loop")
    db = Database(db_url)
    db.upgrade()
    with (
        live_exporter() as healthy,
        stand_in_dcgm_exporter(DCGM_PAGE) as dcgm,
        stand_in_dcgm_exporter(hostile_snapshot()) as json_target,
    ):
        settings = dataclasses.replace(
            default_settings(environ={}),
            db_url=db_url,
            targets=(
                TargetSettings(url=healthy, name="healthy"),
                TargetSettings(url=dcgm.url, name="hostile-dcgm", kind="dcgm"),
                TargetSettings(url=json_target.url.removesuffix("/metrics"), name="hostile-json"),
            ),
            timeout_s=5.0,
            interval_s=10.0,
            spool_dir=str(tmp_path / "spool"),
        )
        collector = Collector(settings, db)
        try:
            results = [collector.run_round() for _ in range(ROUNDS)]
        finally:
            collector.close()
    assert all(r.written and not r.spooled for r in results)
    rejected = results[0].rejected
    assert rejected["dcgm_gpu_index_out_of_range"] == 1
    assert rejected["dcgm_value_out_of_range"] == 1
    assert rejected["dcgm_sentinel"] == 1
    assert rejected["gpu_index_out_of_range"] == 1
    assert rejected["value_out_of_range"] == 1
    assert rejected["pid_out_of_range"] == 1
    assert "unwritable_snapshot" not in rejected  # caught at the door, not by the writer
    metrics = {
        s.labels["reason"]: s.value
        for family in collector.metrics.registry.collect()
        if family.name == "gpulens_collector_rejected_samples"
        for s in family.samples
        if s.name.endswith("_total")
    }
    assert metrics["gpu_index_out_of_range"] == ROUNDS
    with db.engine.connect() as conn:
        rows = dict(
            conn.execute(
                sa.text("SELECT g.node, count(*) FROM gpu_sample s JOIN gpu g ON g.id = s.gpu_id GROUP BY g.node")
            ).all()
        )
        kept = (
            conn.execute(
                sa.text(
                    "SELECT pcie_replays_total FROM gpu_sample s JOIN gpu g ON g.id = s.gpu_id "
                    "WHERE g.node = 'hostile-json'"
                )
            )
            .scalars()
            .all()
        )
    db.close()
    assert rows["node-00"] == ROUNDS * 2  # every round of the healthy target
    told = [r.getMessage() for r in caplog.records if "values rejected (gpu_index_out_of_range)" in r.getMessage()]
    assert told == ["target hostile-json: values rejected (gpu_index_out_of_range)"]  # once, not every round
    assert rows["hostile-dcgm"] == ROUNDS  # its storable GPU, stamped by each round
    assert rows["hostile-json"] == 1  # its storable GPU: the same snapshot (one time stamp) every round
    assert kept  # the reading stayed,
    assert all(v is None for v in kept)  # its unstorable counter did not
