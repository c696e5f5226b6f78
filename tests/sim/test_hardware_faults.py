"""The node-hardware fault kinds: a GPU missing from the start, a fabric that is not ready, nvidia_peermem missing.

Each shows its signature in ``NodeSnapshot.hardware`` on exactly its target, from ``at`` for ``duration``, and leaves
every GPU reading of the cluster as the fault-free run reads it (a missing GPU has none)."""

from __future__ import annotations

import pytest

from gpulens.config import ConfigError
from gpulens.exporter.sim import SimCluster
from gpulens.nodehardware import FABRIC_COMPLETED, FABRIC_NOT_STARTED
from tests.sim.support import at, cluster, steps


@pytest.fixture(scope="module")
def base() -> SimCluster:
    return cluster()


def fault(kind: str, target: str, start: str, duration: str | None = None) -> str:
    lines = ["[[faults]]", f'kind = "{kind}"', target, f'at = "{start}"']
    if duration is not None:
        lines.append(f'duration = "{duration}"')
    return "\n" + "\n".join(lines) + "\n"


def _same_gpus(base: SimCluster, sim: SimCluster, t: float, *, but: tuple[str, int] | None = None) -> None:
    for node in base.node_names():
        want = [g for g in base.snapshot(node, t).gpus if (node, g.gpu) != but]
        assert list(sim.snapshot(node, t).gpus) == want, (node, t)


def test_gpu_missing_from_the_start(base: SimCluster) -> None:
    sim = cluster(fault("gpu_missing", 'gpu = "node-02:3"', "0s"))
    s = sim.scenario
    for t in steps(s, 0, 60):
        snap = sim.snapshot("node-02", t)
        assert [g.gpu for g in snap.gpus] == [0, 1, 2, 4, 5, 6, 7]  # NVML does not list it
        assert not [x for x in snap.links if x.gpu == 3]
        hw = snap.hardware
        assert hw is not None
        assert hw.missing_gpus == ("0000:5d:00.0",)  # GPU 3's address: still on the PCI bus
        assert hw.pci_gpus is not None
        assert len(hw.pci_gpus) == 8
        assert hw.nvml_gpus == 7
        assert [c.gpu for c in hw.gpus] == [0, 1, 2, 4, 5, 6, 7]
    for t in list(steps(s, 0, 60))[::30]:
        _same_gpus(base, sim, t, but=("node-02", 3))
        for node in ("node-00", "node-01", "node-03"):
            assert sim.snapshot(node, t).hardware == base.snapshot(node, t).hardware


def test_gpu_missing_refuses_a_gpu_a_job_holds() -> None:
    with pytest.raises(ConfigError, match="held by no job"):
        cluster(fault("gpu_missing", 'gpu = "node-02:0"', "0s"))


def test_fabric_not_ready_stops_the_fabric_manager_and_every_gpus_registration(base: SimCluster) -> None:
    sim = cluster(fault("fabric_not_ready", 'node = "node-01"', "10m", "20m"))
    s = sim.scenario
    for t in steps(s, 10, 30):
        hw = sim.snapshot("node-01", t).hardware
        assert hw is not None
        assert hw.fabric_manager_running is False
        assert {(c.fabric_state, c.fabric_ready) for c in hw.gpus} == {(FABRIC_NOT_STARTED, False)}
    for t in (at(s, 9.9), at(s, 30)):
        hw = sim.snapshot("node-01", t).hardware
        assert hw is not None
        assert hw.fabric_manager_running is True
        assert {(c.fabric_state, c.fabric_ready) for c in hw.gpus} == {(FABRIC_COMPLETED, True)}
    for t in list(steps(s, 10, 30))[::20]:
        _same_gpus(base, sim, t)
        for node in ("node-00", "node-02", "node-03"):
            assert sim.snapshot(node, t).hardware == base.snapshot(node, t).hardware


def test_fabric_not_ready_needs_nvswitches() -> None:
    with pytest.raises(ConfigError, match="needs NVSwitches"):
        cluster(fault("fabric_not_ready", 'node = "node-03"', "10m", "5m"))  # L40S: PCIe only


def test_peermem_missing_on_its_node_only(base: SimCluster) -> None:
    sim = cluster(fault("peermem_missing", 'node = "node-00"', "5m", "30m"))
    s = sim.scenario
    for t in steps(s, 5, 35):
        hw = sim.snapshot("node-00", t).hardware
        assert hw is not None
        assert hw.peermem_loaded is False
    hw = sim.snapshot("node-00", at(s, 35)).hardware
    assert hw is not None
    assert hw.peermem_loaded is True
    for t in list(steps(s, 5, 35))[::30]:
        _same_gpus(base, sim, t)
        assert sim.snapshot("node-01", t).hardware == base.snapshot("node-01", t).hardware
