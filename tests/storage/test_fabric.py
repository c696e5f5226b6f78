"""RDMA ports, hosts and jobs' hosts on SQLite and PostgreSQL: written with the GPU rows, read back in SI units
through every reader method, rolled up to 1-minute and 1-hour rows, removed by retention, and read with bounded work."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from gpulens.clock import ManualClock
from gpulens.fabricmodel import JobHostReading
from gpulens.storage import fabric, fabricschema
from gpulens.storage.db import Database
from gpulens.storage.retention import Retention, RetentionJob, apply_retention
from gpulens.storage.rollup import Rollups
from gpulens.storage.sqlreader import SqlReader
from gpulens.storage.writer import Writer
from tests.storage.conftest import T0
from tests.storage.fabricdata import GIB, NDR, fabric_snapshot, nic

H0 = T0 - T0 % 3600 + 3600  # an hour boundary
STEP = 30.0  # seconds between rounds


def _count(db: Database, table: str) -> int:
    with db.engine.connect() as conn:
        return int(conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar_one())


def _write_rounds(db: Database, rounds: int, nodes: tuple[str, ...] = ("n1",), **nic_changes: Any) -> Writer:
    writer = Writer(db)
    for i in range(rounds):
        writer.write([fabric_snapshot(node, H0 + STEP * i, i, **nic_changes) for node in nodes])
    return writer


def test_a_round_is_written_with_the_gpus_and_read_back_in_si(db: Database, clock: ManualClock) -> None:
    writer = Writer(db)
    stats = writer.write([fabric_snapshot("n1", H0, 0), fabric_snapshot("n2", H0, 0, job="j2")])
    assert (stats.gpu_rows, stats.nic_rows, stats.host_rows, stats.job_host_rows) == (4, 4, 2, 2)
    again = writer.write([fabric_snapshot("n1", H0, 0)])  # a replayed round: nothing twice
    assert (again.nic_rows, again.host_rows, again.job_host_rows) == (0, 0, 0)
    writer.write([fabric_snapshot("n1", H0 + STEP, 1, state="DOWN", phys_state="Polling", up=False)])
    clock.set(H0 + STEP)
    reader = SqlReader(db)

    nics = reader.latest_nics()
    assert [(n.node, n.device, n.port) for n in nics] == [
        ("n1", "mlx5_0", 1),
        ("n1", "mlx5_1", 1),
        ("n2", "mlx5_0", 1),
        ("n2", "mlx5_1", 1),
    ]
    expected = dataclasses.replace(
        nic("n1", 0, 1, state="DOWN", phys_state="Polling", up=False),
        transmit_packets_total=None,  # not stored
    )
    assert nics[0] == expected
    assert nics[0].gpus == (0,)
    assert nics[0].rate_bytes_per_second == NDR
    assert nics[0].link_speed == "NDR"
    assert [n.node for n in reader.latest_nics(node="n2")] == ["n2", "n2"]
    assert [n.node for n in reader.latest_nics(max_age_s=10)] == ["n1", "n1"]  # n2's newest is 30 s old

    hosts = reader.latest_hosts()
    assert [h.node for h in hosts] == ["n1", "n2"]
    assert hosts[0] == fabric_snapshot("n1", H0, 0).host
    assert reader.latest_hosts(node="n2")[0].memory_total_bytes == 2048 * GIB

    jobs = reader.latest_job_hosts()
    assert [(j.job_id, j.node) for j in jobs] == [("j1", "n1"), ("j2", "n2")]
    assert jobs[0] == JobHostReading("n1", "j1", "/slurm/j1", 2, 140.0, 8.0, 16 * GIB, 64 * GIB, 4.0)
    assert reader.latest_job_hosts(job_id="j2") == [jobs[1]]


def test_ports_of_some_nodes_some_fields_and_each_nodes_counts(db: Database, clock: ManualClock) -> None:
    """``nodes=`` reads those nodes' ports only (one statement), ``fields=`` is checked (every field is read: one
    row holds them all), and ``nic_counts`` counts each node's ports up and in all as the newest readings say."""
    writer = Writer(db)
    writer.write([fabric_snapshot(node, H0, 0) for node in ("n1", "n2", "n3")])
    writer.write([fabric_snapshot("n2", H0 + STEP, 1, state="DOWN", phys_state="Polling", up=False)])
    clock.set(H0 + STEP)
    reader = SqlReader(db)
    every = reader.latest_nics()
    some = reader.latest_nics(nodes=["n3", "n1"])
    assert some == [n for n in every if n.node in ("n1", "n3")]
    assert [n.node for n in some] == ["n1", "n1", "n3", "n3"]
    assert reader.latest_nics(nodes=[]) == []
    assert reader.latest_nics(fields=["up", "transmit_bytes_per_second"]) == every
    with pytest.raises(ValueError, match="unknown port fields nope"):
        reader.latest_nics(fields=["up", "nope"])
    counts = reader.nic_counts()
    assert counts == {"n1": (2, 2), "n2": (0, 2), "n3": (2, 2)}
    assert counts == {
        node: (sum(n.up for n in every if n.node == node), sum(1 for n in every if n.node == node))
        for node in ("n1", "n2", "n3")
    }


def test_a_finished_job_is_not_on_its_node_any_more(db: Database) -> None:
    writer = Writer(db)
    writer.write([fabric_snapshot("n1", H0, 0, job="old")])
    writer.write([fabric_snapshot("n1", H0 + STEP, 1, job="new")])
    assert [j.job_id for j in fabric.latest_job_hosts(db)] == ["new"]
    assert fabric.latest_job_hosts(db, job_id="old") == []


def test_unknown_codes_and_values_that_do_not_fit_read_as_none(db: Database) -> None:
    Writer(db).write([fabric_snapshot("n1", H0, 0, state="SOMETHING_NEW", link_speed=None, symbol_errors_total=2**40)])
    n = fabric.latest_nics(db)[0]
    assert (n.state, n.link_speed, n.symbol_errors_total, n.phys_state) == (None, None, None, "LinkUp")


def test_series_read_raw_then_rollups_with_counter_rates(db: Database) -> None:
    _write_rounds(db, 2 * 120 + 1)  # two hours at 30 s
    raw = fabric.nic_series(db, ["n1/mlx5_0/1", "n1/mlx5_9/1", "bad"], ["transmit_bytes_total", "up"], H0, H0 + 600)
    assert list(raw) == ["n1/mlx5_0/1"]
    data = raw["n1/mlx5_0/1"]
    assert data.uuid == "n1/mlx5_0/1"
    assert data.resolution == "raw"
    assert all(v == pytest.approx(1e9 / STEP) for v in data.values["transmit_bytes_total"][1:])
    assert set(data.values["up"]) == {1.0}

    written = Rollups(db).run(H0 + 3 * 3600)
    assert written > 0
    for table in ("nic_rollup_1m", "host_rollup_1m", "job_host_rollup_1m"):
        assert _count(db, table) > 0, table
    assert _count(db, "nic_rollup_1h") == 2 * 2  # two full hours of two ports
    assert _count(db, "host_rollup_1h") == 2
    assert _count(db, "job_host_rollup_1h") == 2

    fields = ["transmit_bytes_per_second", "receive_bytes_total", "cnp_handled_per_second", "link_downed_total"]
    minutes = fabric.nic_series(db, ["n1/mlx5_1/1"], fields, H0, H0 + 7200, max_points=100)["n1/mlx5_1/1"]
    assert minutes.resolution == "1m"
    assert minutes.values["transmit_bytes_per_second"] == pytest.approx([1e8] * len(minutes.timestamps))
    assert minutes.values["receive_bytes_total"][1] == pytest.approx(2e9 / STEP)
    assert minutes.values["cnp_handled_per_second"][0] == pytest.approx(0.5)
    assert set(minutes.values["link_downed_total"]) == {0.0}
    hours = fabric.nic_series(db, ["n1/mlx5_1/1"], ["transmit_bytes_total"], H0, H0 + 3600, max_points=2)
    assert hours["n1/mlx5_1/1"].resolution == "1h"
    assert hours["n1/mlx5_1/1"].values["transmit_bytes_total"][0] == pytest.approx(1e9 / STEP)

    reader = SqlReader(db)
    host = reader.host_series(["n1", "n9"], ["cpu_busy_ratio", "memory_used_bytes"], H0, H0 + 7200, max_points=3)
    assert list(host) == ["n1"]
    assert host["n1"].resolution == "1h"
    assert host["n1"].values["cpu_busy_ratio"][0] == pytest.approx(0.25)
    assert host["n1"].values["memory_used_bytes"][0] == pytest.approx(512 * GIB)
    job = reader.job_host_series("j1", ["cpu_used_cores", "memory_used_bytes"], H0, H0 + 7200, max_points=100)
    assert list(job) == ["n1"]
    assert job["n1"].resolution == "1m"
    assert job["n1"].values["cpu_used_cores"] == pytest.approx([4.0] * len(job["n1"].timestamps))
    assert reader.job_host_series("nope", ["cpu_used_cores"], H0, H0 + 60) == {}
    with pytest.raises(ValueError, match="unknown fields power_watts"):
        reader.nic_series(["n1/mlx5_0/1"], ["power_watts"], H0, H0 + 60)


def test_link_flaps_read_as_a_rate_of_link_downed(db: Database) -> None:
    writer = Writer(db)
    for i in range(20):
        snap = fabric_snapshot("n1", H0 + STEP * i, i)
        downed = dataclasses.replace(snap.nics[0], link_downed_total=i // 4)  # one flap every 2 minutes
        writer.write([dataclasses.replace(snap, nics=(downed, *snap.nics[1:]))])
    data = fabric.nic_series(db, ["n1/mlx5_0/1"], ["link_downed_total"], H0, H0 + 600, max_points=6)["n1/mlx5_0/1"]
    total = sum((v or 0.0) * data.step_seconds for v in data.values["link_downed_total"])
    assert total == pytest.approx(4.0)


def test_rollup_steps_cover_every_family(db: Database) -> None:
    _write_rounds(db, 5, nodes=("n1", "n2", "n3"))
    rollups = Rollups(db, slice_gpus=1)
    steps = 0
    while rollups.step(H0 + 600, max_seconds=10.0):
        steps += 1
    assert steps >= 4  # one slice per step: GPUs, then ports, hosts and jobs' hosts
    assert _count(db, "nic_rollup_1m") == 3 * 2 * 3  # three minutes with samples, two ports, three nodes
    assert _count(db, "host_rollup_1m") == 3 * 3
    assert _count(db, "job_host_rollup_1m") == 3 * 3


def _retention_counts(db: Database) -> dict[str, int]:
    tables = [f.table(tier) for f in fabricschema.FABRIC_FAMILIES for tier in ("raw", "1m", "1h")]
    return {table: _count(db, table) for table in [*tables, "nic", "host", "job_host"]}


@pytest.mark.parametrize("stepwise", [False, True])
def test_retention_removes_old_fabric_rows(db: Database, stepwise: bool) -> None:
    _write_rounds(db, 130)
    Rollups(db).run(H0 + 3 * 3600)
    before = _retention_counts(db)
    assert all(before.values()), before
    now = H0 + 3000 * 86_400.0  # past every period: everything goes, the dimension rows too
    retention = Retention(raw_s=86_400.0, minute_s=2 * 86_400.0, hour_s=3 * 86_400.0)
    if stepwise:
        job = RetentionJob(db, retention)
        while job.step(now, max_seconds=10.0):
            pass
        removed: dict[str, Any] = job.removed
    else:
        removed = apply_retention(db, now, retention)
    assert _retention_counts(db) == dict.fromkeys(before, 0)
    assert removed["nic.rows"] == 2
    assert removed["host.rows"] == 1
    unit = "partitions" if db.dialect == "postgresql" else "rows"
    assert removed[f"nic_sample.{unit}"] > 0
    assert removed[f"job_host_rollup_1m.{unit}"] > 0


def test_recent_rows_survive_retention(db: Database) -> None:
    _write_rounds(db, 10)
    apply_retention(db, H0 + 600, Retention())
    assert _count(db, "nic_sample") == 20
    assert len(fabric.latest_nics(db)) == 2


def _sqlite_steps(db: Database, read: Any) -> int:
    """Virtual machine instructions SQLite ran for ``read()``: a measure of the rows it touched."""
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    def install(conn: sa.Connection, *_: Any) -> None:
        conn.connection.dbapi_connection.set_progress_handler(count, 1)  # type: ignore[union-attr]

    event.listen(db.engine, "before_cursor_execute", install)
    try:
        read()
    finally:
        event.remove(db.engine, "before_cursor_execute", install)
    return steps


def test_latest_nics_of_one_node_reads_only_that_nodes_rows(db: Database) -> None:
    nodes = tuple(f"node-{k:02d}" for k in range(40))
    _write_rounds(db, 3, nodes=nodes)
    if db.dialect == "sqlite":
        one = _sqlite_steps(db, lambda: fabric.latest_nics(db, node="node-07"))
        every = _sqlite_steps(db, lambda: fabric.latest_nics(db))
        assert one * 10 < every, (one, every)
        return
    sql = fabric.latest_sql(fabricschema.NIC, "postgresql", ["node"])
    with db.engine.connect() as conn:
        plan = conn.execute(sa.text(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}"), {"node": "node-07"}).scalar_one()
    scanned: list[int] = []

    def walk(node: dict[str, Any]) -> None:
        if "nic_sample" in str(node.get("Relation Name", "")):
            scanned.append(node["Actual Rows"] * node["Actual Loops"])
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"])
    assert scanned  # one newest row of each of the node's two ports
    assert sum(scanned) <= 2, scanned


def test_si_views_read_the_fabric_tables_in_si_units(db: Database) -> None:
    _write_rounds(db, 5, state="INIT")
    Rollups(db).run(H0 + 600)
    with db.engine.connect() as conn:
        row = conn.execute(sa.text("SELECT * FROM nic_sample_si WHERE device = 'mlx5_1' ORDER BY ts_ms DESC")).first()
        minute = conn.execute(sa.text("SELECT * FROM nic_rollup_1m_si ORDER BY ts_ms")).mappings().first()
        host = conn.execute(sa.text("SELECT * FROM host_sample_si")).mappings().first()
        job = conn.execute(sa.text("SELECT * FROM job_host_rollup_1m_si")).mappings().first()
    assert row is not None
    port = row._mapping
    assert (port["node"], port["device"], port["port"], port["gpus"]) == ("n1", "mlx5_1", 1, "1")
    assert (port["state"], port["phys_state"], port["link_speed"]) == ("INIT", "LinkUp", "NDR")
    assert port["rate_bytes_per_second"] == NDR
    assert port["transmit_bytes_total"] == 4 * 10**9
    assert port["cnp_handled_per_second"] == pytest.approx(0.5)
    assert minute is not None
    assert minute["transmit_bytes_per_second_mean"] == pytest.approx(1e8)
    assert minute["receive_bytes_total_increase"] > 0
    assert host is not None
    assert host["memory_total_bytes"] == 2048 * GIB
    assert host["cpu_busy_ratio"] == pytest.approx(0.25)
    assert job is not None
    assert job["cpu_used_cores_mean"] == pytest.approx(4.0)
    assert job["job_id"] == "j1"


def test_a_late_round_recomputes_the_fabric_rollups(db: Database) -> None:
    _write_rounds(db, 6)  # three minutes
    rollups = Rollups(db)
    rollups.run(H0 + 600)
    before = fabric.nic_series(db, ["n1/mlx5_0/1"], ["transmit_bytes_per_second"], H0, H0 + 180, max_points=4)
    assert before["n1/mlx5_0/1"].resolution == "1m"
    assert before["n1/mlx5_0/1"].maximum["transmit_bytes_per_second"][0] == pytest.approx(1e8)
    Writer(db).write([fabric_snapshot("n1", H0 + 15, 0, transmit_bytes_per_second=9e8)])  # replayed from a spool
    rollups.run(H0 + 600)
    after = fabric.nic_series(db, ["n1/mlx5_0/1"], ["transmit_bytes_per_second"], H0, H0 + 180, max_points=4)
    assert after["n1/mlx5_0/1"].maximum["transmit_bytes_per_second"][0] == pytest.approx(9e8)
