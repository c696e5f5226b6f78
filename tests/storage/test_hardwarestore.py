"""Each node's hardware in the store (``node_hardware``, revision 0016): written when it changes, read back into a
store round, where the hardware rules judge it as the collector's own engine does."""

from __future__ import annotations

import dataclasses

import sqlalchemy as sa

from gpulens.alerts import hardwarechecks
from gpulens.alerts.history import History
from gpulens.alerts.rules import builtin_rules
from gpulens.alerts.storeround import store_round
from gpulens.model import NodeSnapshot
from gpulens.nodehardware import FABRIC_NOT_STARTED, GpuConfig, NodeHardware
from gpulens.nodehealth import node_health
from gpulens.storage import hardwarestore
from gpulens.storage.db import Database
from gpulens.storage.sqlreader import SqlReader
from gpulens.storage.writer import Writer
from tests.storage.conftest import T0
from tests.storage.data import snapshot

RULES = {r.name: r for r in builtin_rules()}


def _hardware(**changes: object) -> NodeHardware:
    base = NodeHardware(
        pci_gpus=("0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0"),
        missing_gpus=("0000:3a:00.0",),
        nvml_gpus=2,
        ib_ports_expected=4,
        ib_ports_active=3,
        ib_rate_expected_bytes_per_second=5e10,
        ib_ports_slow=(("mlx5_2", 1, 2.5e10),),
        nvswitches=4,
        fabric_manager_running=True,
        peermem_loaded=True,
        gpus=(GpuConfig(0, "GPU-0", True, True, FABRIC_NOT_STARTED, False),),
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def _snap(node: str, t: float, hw: NodeHardware, driver: str | None = None) -> NodeSnapshot:
    return snapshot(node, t).replace(hardware=hw, driver_version=driver)


def _rows(db: Database) -> int:
    with db.session() as session:
        return int(session.execute(sa.select(sa.func.count()).select_from(hardwarestore.node_hardware)).scalar_one())


def test_written_when_it_changes_and_read_back(db: Database) -> None:
    writer = Writer(db)
    hw = _hardware()
    first = [_snap("n1", T0, hw, "550.127.08"), snapshot("n2", T0)]
    writer.write(first)
    assert hardwarestore.latest(db) == {"n1": (hw, "550.127.08")}
    with db.session() as session:
        before = session.execute(sa.select(hardwarestore.node_hardware.c.ts_ms)).scalar_one()
    writer.write([_snap("n1", T0 + 10, hw, "550.127.08")])  # unchanged: not written
    with db.session() as session:
        assert session.execute(sa.select(hardwarestore.node_hardware.c.ts_ms)).scalar_one() == before
    changed = _hardware(missing_gpus=())
    writer.write([_snap("n1", T0 + 20, changed, "550.127.08")])
    assert hardwarestore.latest(db, ["n1"]) == {"n1": (changed, "550.127.08")}
    assert _rows(db) == 1
    assert Writer(db).write([_snap("n1", T0 + 30, changed)]) is not None  # another writer: rewritten
    assert hardwarestore.latest(db) == {"n1": (changed, None)}


def test_the_rules_over_a_store_round_judge_the_stored_hardware(db: Database) -> None:
    Writer(db).write([_snap("n1", T0, _hardware(), "550.127.08"), snapshot("n2", T0)])
    result = store_round(SqlReader(db), T0 + 5, max_age_s=60)
    by_node = {s.node: s for s in result.snapshots}
    assert by_node["n1"].hardware == _hardware()
    assert by_node["n1"].driver_version == "550.127.08"
    assert by_node["n2"].hardware is None
    history = History()
    history.add(T0 + 5, result.snapshots)
    [missing] = hardwarechecks.gpu_missing(RULES["GpuMissing"], history, T0 + 5)
    assert missing.labels["pci_bus_id"] == "0000:3a:00.0"
    [ports] = hardwarechecks.ib_port_missing(RULES["IbPortMissing"], history, T0 + 5)  # no ports in a store round
    assert "3 of 4 expected" in ports.summary
    [slow] = hardwarechecks.ib_port_slow(RULES["IbPortSlow"], history, T0 + 5)  # as the agent counted it
    assert (slow.labels["device"], slow.labels["port"]) == ("mlx5_2", "1")
    assert "200 Gb/s, expected 400 Gb/s" in slow.summary
    [fabric] = hardwarechecks.gpu_fabric_not_ready(RULES["GpuFabricNotReady"], history, T0 + 5)
    assert fabric.labels["gpu"] == "0"


def test_the_nodes_health_rides_in_its_hardware_row(db: Database) -> None:
    """The row carries ``node_health`` of the snapshot that wrote it; a change of health alone (a GPU lost, the
    hardware unchanged) rewrites it."""
    writer = Writer(db)
    hw = _hardware()
    healthy = _snap("n1", T0, hw)
    writer.write([healthy])
    [(node, first)] = SqlReader(db).node_health().items()
    assert (node, first) == ("n1", node_health(healthy))
    lost = healthy.replace(gpus=(dataclasses.replace(healthy.gpus[0], up=False), *healthy.gpus[1:]))
    writer.write([lost])
    again = hardwarestore.latest_health(db)["n1"]
    assert again.state == "Unhealthy"
    assert any("does not answer" in f.reason for f in again.findings)
    assert hardwarestore.latest(db) == {"n1": (hw, None)}  # the hardware reads back as it was
    assert hardwarestore.latest_health(db, ["n2"]) == {}
