"""The read path on SQLite and PostgreSQL: latest readings, series across tiers, counter rates, jobs, summaries."""

from __future__ import annotations

import dataclasses
import math

import pytest

from gpulens.clock import ManualClock
from gpulens.model import NodeSnapshot
from gpulens.storage import inventory, jobstats, latest, timeseries
from gpulens.storage.db import Database
from gpulens.storage.rollup import Rollups
from gpulens.storage.sqlreader import SqlReader
from gpulens.storage.writer import Writer
from tests.fakes.static_source import GIB, h100
from tests.storage.conftest import T0
from tests.storage.data import snapshot, uuid_of

UUID = uuid_of("n", 0)


def _one_gpu(t: float, **changes: object) -> NodeSnapshot:
    return snapshot("n", t, gpus=1, **changes)


def test_latest_readings_are_the_newest_per_gpu(db: Database, clock: ManualClock) -> None:
    writer = Writer(db)
    for k in range(20):
        writer.write([snapshot("n", T0 + 10 * k, power_watts=100.0 + k)])
    writer.write([snapshot("old", T0 - 3600)])
    clock.set(T0 + 200)
    readings = latest.latest_readings(db)
    assert [(r.node, r.gpu) for r in readings] == [("n", 0), ("n", 1), ("old", 0), ("old", 1)]
    assert [r.power_watts for r in readings[:2]] == [119.0, 119.0]
    assert {r.timestamp for r in readings[:2]} == {T0 + 190}
    fresh = latest.latest_readings(db, max_age_s=60)
    assert [r.node for r in fresh] == ["n", "n"]
    # a page reads only what it shows: one node, or some GPUs, selected in SQL
    assert [(r.node, r.gpu) for r in latest.latest_readings(db, node="old")] == [("old", 0), ("old", 1)]
    assert [r.uuid for r in latest.latest_readings(db, uuids=[uuid_of("n", 1)])] == [uuid_of("n", 1)]
    assert latest.latest_readings(db, uuids=[]) == []
    assert [r.node for r in latest.latest_readings(db, node="old", max_age_s=60)] == []
    reader = SqlReader(db)
    assert reader.latest_readings(node="n", uuids=[uuid_of("n", 0), uuid_of("old", 0)]) == readings[:1]


def test_latest_readings_read_only_the_fields_asked_for(db: Database) -> None:
    Writer(db).write([snapshot("n", T0, power_watts=150.0)])
    [whole, _] = latest.latest_readings(db)
    [narrow, _] = SqlReader(db).latest_readings(fields=("power_watts", "memory_total_bytes"))
    assert (narrow.power_watts, narrow.memory_total_bytes) == (150.0, whole.memory_total_bytes)
    assert (narrow.node, narrow.uuid, narrow.model, narrow.timestamp, narrow.up) == (
        whole.node,
        whole.uuid,
        whole.model,
        whole.timestamp,
        whole.up,
    )
    assert whole.utilization_ratio is not None
    assert whole.temperature_celsius is not None
    assert (narrow.utilization_ratio, narrow.temperature_celsius, narrow.xid_errors) == (None, None, {})
    with pytest.raises(ValueError, match="unknown reading fields: power"):
        latest.latest_readings(db, fields=("power",))


def test_series_downsamples_raw_data_to_max_points(db: Database) -> None:
    writer = Writer(db)
    powers = {T0 + 10 * k: float(100 + k % 7) for k in range(361)}  # one hour at 10 s
    writer.write([_one_gpu(t, power_watts=p) for t, p in powers.items()])
    result = timeseries.series(db, [UUID, "GPU-unknown"], ["power_watts"], T0, T0 + 3600, max_points=50)
    assert list(result) == [UUID]
    data = result[UUID]
    assert data.resolution == "raw"
    assert 0 < len(data.timestamps) <= 50
    step = data.step_seconds
    for start, mean, low, high in zip(
        data.timestamps,
        data.values["power_watts"],
        data.minimum["power_watts"],
        data.maximum["power_watts"],
        strict=True,
    ):
        in_bucket = [p for t, p in powers.items() if start <= t < start + step]
        assert mean == pytest.approx(sum(in_bucket) / len(in_bucket))
        assert (low, high) == (min(in_bucket), max(in_bucket))
    assert sum(1 for t in powers if data.timestamps[0] <= t) == 361


def test_series_returns_every_point_when_there_are_few(db: Database) -> None:
    Writer(db).write([_one_gpu(T0 + 10 * k, utilization_ratio=k / 10) for k in range(10)])
    data = timeseries.series(db, [UUID], ["utilization_ratio"], T0, T0 + 90)[UUID]
    assert data.timestamps == tuple(T0 + 10 * k for k in range(10))
    assert data.values["utilization_ratio"] == pytest.approx([k / 10 for k in range(10)])


def test_counters_are_rates_and_resets_count_from_zero(db: Database) -> None:
    energy = [1e6 + 700.0 * k for k in range(30)] + [700.0 * (k + 1) for k in range(30)]  # exporter restart at k=30
    Writer(db).write([_one_gpu(T0 + 10 * k, energy_joules_total=e) for k, e in enumerate(energy)])
    data = timeseries.series(db, [UUID], ["energy_joules_total", "power_watts"], T0, T0 + 600)[UUID]
    rates = [r for r in data.values["energy_joules_total"] if r is not None]
    assert len(rates) == 59
    assert rates == pytest.approx([70.0] * 59)


def test_counter_resets_inside_rolled_up_minutes(db: Database, clock: ManualClock) -> None:
    start = T0 - T0 % 60
    energy = [1e6 + 700.0 * k for k in range(90)] + [700.0 * (k + 1) for k in range(90)]  # restart after 15 min
    Writer(db).write([_one_gpu(start + 10 * k, energy_joules_total=e) for k, e in enumerate(energy)])
    end = start + 1800
    clock.set(end)
    Rollups(db, settle_s=0).run(end)
    data = timeseries.series(db, [UUID], ["energy_joules_total"], start, end, max_points=16)[UUID]
    assert data.resolution == "1m"
    rates = data.values["energy_joules_total"]
    assert len(rates) == 16  # 120-second buckets aligned to the epoch: the range starts mid-bucket
    assert rates == pytest.approx([70.0] * 16)


def test_series_from_rollups_when_the_range_is_long(db: Database, clock: ManualClock) -> None:
    writer = Writer(db)
    hours = 30
    samples = [
        _one_gpu(T0 + 60 * k, power_watts=float(200 + (k % 60)), energy_joules_total=6000.0 * k)
        for k in range(hours * 60)
    ]
    writer.write(samples)
    end = T0 + hours * 3600
    clock.set(end)
    assert Rollups(db).run(end) > 0
    short = timeseries.series(db, [UUID], ["power_watts"], end - 3600, end)[UUID]
    day = timeseries.series(db, [UUID], ["power_watts", "energy_joules_total"], end - 86_400, end)[UUID]
    long = timeseries.series(db, [UUID], ["power_watts", "energy_joules_total"], T0, end, max_points=40)[UUID]
    assert (short.resolution, day.resolution, long.resolution) == ("raw", "1m", "1h")
    assert len(day.timestamps) <= 1000
    assert len(long.timestamps) <= 40
    assert long.step_seconds % 3600 == 0
    # Each hour holds minutes 0..59 of the same pattern: the mean is 229.5 W, min 200, max 259.
    assert long.values["power_watts"][1] == pytest.approx(229.5)
    assert (long.minimum["power_watts"][1], long.maximum["power_watts"][1]) == (200.0, 259.0)
    # 6000 J a minute is 100 W, in every tier, including the tail not yet rolled up.
    assert day.values["energy_joules_total"][1:] == pytest.approx([100.0] * (len(day.timestamps) - 1))
    assert long.values["energy_joules_total"][1:] == pytest.approx([100.0] * (len(long.timestamps) - 1))


def test_series_rejects_unknown_fields(db: Database) -> None:
    with pytest.raises(ValueError, match="no_such_field"):
        timeseries.series(db, [UUID], ["no_such_field"], T0, T0 + 60)


def test_job_gpu_hours_and_utilization(db: Database) -> None:
    writer = Writer(db)
    for k in range(61):  # one hour, a reading a minute; GPU 0 at 50 %, GPU 1 at 100 %
        snap = snapshot("n", T0 + 60 * k, job="42")
        gpus = (
            dataclasses.replace(snap.gpus[0], utilization_ratio=0.5, memory_used_bytes=10 * GIB),
            dataclasses.replace(snap.gpus[1], utilization_ratio=1.0, memory_used_bytes=30 * GIB),
        )
        writer.write([snap.replace(gpus=gpus)])
    writer.write([snapshot("n", T0 + 3660)])  # the job is gone
    [job] = jobstats.jobs(db, T0 - 600, T0 + 7200)
    assert job.job_id == "42"
    assert job.user == "alice"
    assert job.gpus == (uuid_of("n", 0), uuid_of("n", 1))
    assert job.nodes == ("n",)
    assert (job.first_seen, job.last_seen) == (T0, T0 + 3600)
    assert job.gpu_hours == 2.0
    assert job.utilization_ratio_mean == pytest.approx(0.75)
    assert job.utilization_ratio_stddev == pytest.approx(0.25)
    assert job.memory_used_bytes_mean == pytest.approx(20 * GIB)
    assert job.memory_used_bytes_max == 30 * GIB
    [half] = jobstats.jobs(db, T0 + 1800, T0 + 7200)
    assert half.gpu_hours == 1.0
    assert jobstats.jobs(db, T0 + 4000, T0 + 5000) == []


def test_cluster_summary(db: Database, clock: ManualClock) -> None:
    writer = Writer(db)
    busy = h100("a", 0, T0, utilization_ratio=0.9, power_watts=600.0)
    allocated_idle = h100("a", 1, T0, utilization_ratio=0.0, power_watts=80.0)
    idle = h100("b", 0, T0, utilization_ratio=0.01, power_watts=70.0)
    lost = h100("b", 1, T0, up=False, utilization_ratio=None, power_watts=None, memory_used_bytes=None)
    stale = h100("c", 0, T0 - 600)
    held = snapshot("a", T0, gpus=2, job="9")
    writer.write([snapshot("c", T0 - 600, gpus=0).replace(gpus=(stale,))])
    writer.write([held.replace(gpus=(busy, allocated_idle)), snapshot("b", T0, gpus=0).replace(gpus=(idle, lost))])
    clock.set(T0 + 5)
    summary = latest.cluster_summary(db, max_age_s=60)
    assert (summary.gpus_total, summary.gpus_reporting, summary.gpus_up) == (5, 4, 3)
    assert (summary.gpus_busy, summary.gpus_idle, summary.gpus_allocated_idle) == (1, 2, 1)
    assert summary.utilization_ratio_mean == pytest.approx((0.9 + 0.0 + 0.01) / 3)
    assert summary.power_watts == pytest.approx(750.0)
    assert summary.memory_used_bytes == 3 * busy.memory_used_bytes  # type: ignore[operator]
    assert summary.memory_total_bytes == 3 * busy.memory_total_bytes  # type: ignore[operator]
    assert (summary.nodes_total, summary.nodes_reporting) == (3, 2)
    assert math.isclose(summary.timestamp, T0 + 5)


def test_gpu_info(db: Database) -> None:
    Writer(db).write([snapshot("n", T0, gpus=2)])
    info = inventory.gpu_info(db)
    assert [(i.node, i.gpu, i.uuid, i.model, i.pci_bus_id) for i in info] == [
        ("n", 0, uuid_of("n", 0), "NVIDIA H100 80GB HBM3", "00000000:18:00.0"),
        ("n", 1, uuid_of("n", 1), "NVIDIA H100 80GB HBM3", "00000000:19:00.0"),
    ]
    # of some GPUs only, selected in SQL (the job page asks for its own GPUs, not the cluster's)
    assert [i.gpu for i in inventory.gpu_info(db, uuids=[uuid_of("n", 1), "GPU-unknown"])] == [1]
    assert inventory.gpu_info(db, uuids=[]) == []


def test_jobs_for_one_job_id(db: Database) -> None:
    writer = Writer(db)
    writer.write([snapshot("a", T0, job="1"), snapshot("b", T0, job="2")])
    writer.write([snapshot("a", T0 + 60, job="1"), snapshot("b", T0 + 60, job="2")])
    assert [j.job_id for j in jobstats.jobs(db, T0, T0 + 60)] == ["1", "2"]
    [only] = jobstats.jobs(db, T0, T0 + 60, job_id="2")
    assert (only.job_id, only.nodes, only.gpu_hours) == ("2", ("b",), pytest.approx(2 * 60 / 3600))
