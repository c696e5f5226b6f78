"""NIC-to-GPU affinity: nearest by PCIe switch, else by NUMA node, from the sysfs topology."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from gpulens.exporter.fabric.affinity import (
    VIA_NUMA_NODE,
    VIA_PCIE_SWITCH,
    NicAffinity,
    PciPlace,
    PciTopology,
    nearest_gpus,
    place_of,
    sysfs_bus_id,
)
from gpulens.exporter.fabric.ibports import IbPortReader
from tests.exporter.fabric.conftest import GPU_BUS_IDS, SYSFS


def place(path: str, numa: int | None = None) -> PciPlace:
    found = place_of(path, numa)
    assert found is not None
    return found


def test_fixture_node_maps_each_nic_to_its_switch_mate() -> None:
    topology = PciTopology(root=str(SYSFS))
    nics = topology.assign(IbPortReader("n", root=str(SYSFS)).read(), GPU_BUS_IDS)
    assert {n.device: n.gpus for n in nics} == {
        **{f"mlx5_{i}": (i,) for i in range(8)},
        "mlx5_8": (4, 5, 6, 7),  # RoCE port behind its own root port on NUMA node 1: that node's GPUs
        "mlx5_9": (0, 1, 2, 3),  # down port behind its own root port on NUMA node 0
    }
    assert topology.errors == {}


def test_affinities_say_why() -> None:
    topology = PciTopology(root=str(SYSFS))
    found = topology.affinities(["0000:17:00.0", "0000:e1:00.0"], GPU_BUS_IDS)
    assert found == {
        "0000:17:00.0": NicAffinity((0,), VIA_PCIE_SWITCH),
        "0000:e1:00.0": NicAffinity((4, 5, 6, 7), VIA_NUMA_NODE),
    }


def test_place_resolves_the_bus_symlink_into_the_chain() -> None:
    gpu = PciTopology(root=str(SYSFS)).place("00000000:18:00.0")
    assert gpu == PciPlace(
        bus_id="0000:18:00.0",
        chain=("pci0000:00", "0000:00:01.0", "0000:0f:00.0", "0000:10:01.0", "0000:18:00.0"),
        numa_node=0,
    )


def test_sysfs_bus_id_spelling() -> None:
    assert sysfs_bus_id("00000000:18:00.0") == "0000:18:00.0"
    assert sysfs_bus_id("00000000:1A:00.1") == "0000:1a:00.1"
    assert sysfs_bus_id("0000:e1:00.0") == "0000:e1:00.0"
    assert sysfs_bus_id("0001:00:02.0") == "0001:00:02.0"
    assert sysfs_bus_id("GPU-0") is None
    assert sysfs_bus_id("0000:e1:00.9") is None


def test_place_of_needs_a_host_bridge() -> None:
    assert place_of("/sys/devices/platform/serial8250") is None
    assert place_of("/sys/devices/pci0000:00") is None
    assert place_of("/sys/devices/pci0000:00/0000:00:01.0/infiniband") is None
    assert place_of("/sys/devices/pci0000:00/0000:00:01.0/0000:0f:00.0", 1) == PciPlace(
        "0000:0f:00.0", ("pci0000:00", "0000:00:01.0", "0000:0f:00.0"), 1
    )


SWITCH = "/sys/devices/pci0000:00/0000:00:01.0/0000:0f:00.0"


def test_two_gpus_under_the_nics_switch_are_both_served() -> None:
    nic = place(f"{SWITCH}/0000:10:00.0/0000:17:00.0", 0)
    gpus = {
        0: place(f"{SWITCH}/0000:10:01.0/0000:18:00.0", 0),
        1: place(f"{SWITCH}/0000:10:02.0/0000:19:00.0", 0),
        2: place("/sys/devices/pci0000:00/0000:00:02.0/0000:2f:00.0/0000:30:01.0/0000:38:00.0", 0),
    }
    assert nearest_gpus(nic, gpus) == NicAffinity((0, 1), VIA_PCIE_SWITCH)


def test_a_lower_shared_switch_beats_an_upper_one() -> None:
    lower = f"{SWITCH}/0000:10:00.0/0000:11:00.0"  # a second-level switch under the first one's port 0
    nic = place(f"{lower}/0000:12:00.0/0000:17:00.0", 0)
    gpus = {
        0: place(f"{lower}/0000:12:01.0/0000:18:00.0", 0),
        1: place(f"{SWITCH}/0000:10:01.0/0000:19:00.0", 0),
    }
    assert nearest_gpus(nic, gpus) == NicAffinity((0,), VIA_PCIE_SWITCH)


def test_sharing_only_the_root_complex_falls_back_to_numa() -> None:
    nic = place("/sys/devices/pci0000:00/0000:00:01.0/0000:17:00.0", 0)
    gpus = {
        0: place("/sys/devices/pci0000:00/0000:00:02.0/0000:18:00.0", 0),
        1: place("/sys/devices/pci0000:80/0000:80:01.0/0000:98:00.0", 1),
    }
    assert nearest_gpus(nic, gpus) == NicAffinity((0,), VIA_NUMA_NODE)
    assert nearest_gpus(dataclasses.replace(nic, numa_node=None), gpus) == NicAffinity()
    assert nearest_gpus(dataclasses.replace(nic, numa_node=3), gpus) == NicAffinity()
    assert nearest_gpus(nic, {}) == NicAffinity()


def test_unknown_numa_node_gives_no_gpus(sysfs: Path) -> None:
    numa = sysfs / "sys" / "bus" / "pci" / "devices" / "0000:e1:00.0" / "numa_node"
    numa.write_text("-1\n")
    topology = PciTopology(root=str(sysfs))
    assert topology.affinities(["0000:e1:00.0"], GPU_BUS_IDS) == {"0000:e1:00.0": NicAffinity()}
    assert topology.errors == {}


def test_unplaceable_devices_are_counted_and_left_out(sysfs: Path) -> None:
    (sysfs / "sys" / "bus" / "pci" / "devices" / "0000:38:00.0").unlink()  # GPU 1 vanished from sysfs
    topology = PciTopology(root=str(sysfs))
    nics = IbPortReader("n", root=str(sysfs)).read()
    nics = (dataclasses.replace(nics[0], pci_bus_id=None), *nics[1:])
    gpus = {**GPU_BUS_IDS, 8: "not-an-address"}
    mapped = {n.device: n.gpus for n in topology.assign(nics, gpus)}
    assert mapped["mlx5_0"] == ()  # no PCI address: nothing to place
    assert mapped["mlx5_1"] == (0, 2, 3)  # its switch mate is gone: same-NUMA GPUs instead
    assert mapped["mlx5_2"] == (2,)
    assert topology.errors == {"affinity_unresolved": 1, "affinity_malformed": 1}
    topology.assign(nics, gpus)
    assert topology.errors["affinity_unresolved"] == 1  # placements are cached, failures too
