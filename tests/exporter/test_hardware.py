"""The node's hardware against what it should be: the PCI bus against NVML, the expectation flags, the fabric
manager, nvidia_peermem, and each GPU's settings and fabric state through the fake NVML."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from gpulens.clock import ManualClock
from gpulens.exporter.fabric.hardware import Expectation, HardwareReader
from gpulens.exporter.metrics import ExporterHealth, render_metrics
from gpulens.exporter.nvml import NvmlSource
from gpulens.fabricmodel import NicReading
from gpulens.model import NodeSnapshot
from gpulens.nodehardware import FABRIC_IN_PROGRESS, NodeHardware, missing_gpus, sysfs_bus_id
from tests.fakes.fake_nvml import FakeNvml

HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)  # the fake NVML's H100 addresses


def _device(root: Path, address: str, vendor: str, cls: str) -> None:
    where = root / "sys" / "bus" / "pci" / "devices" / address
    where.mkdir(parents=True)
    (where / "vendor").write_text(vendor + "\n")
    (where / "class").write_text(cls + "\n")


def hgx_tree(root: Path, *, gpus: int = 8, nvswitches: int = 4) -> Path:
    """A sysfs tree with ``gpus`` H100s (3D controller), ``nvswitches`` NVSwitches, an Intel NIC and a VGA chip."""
    for i in range(gpus):
        _device(root, f"0000:{HGX_BUSES[i]:02x}:00.0", "0x10de", "0x030200")
    for i in range(nvswitches):
        _device(root, f"0000:{0x05 + i:02x}:00.0", "0x10de", "0x068000")
    _device(root, "0000:01:00.0", "0x8086", "0x020000")
    _device(root, "0000:03:00.0", "0x1a03", "0x030000")  # the BMC's VGA: display class, not NVIDIA
    return root


@pytest.fixture
def nvml_snapshot() -> NodeSnapshot:
    """What NVML reads on an HGX node whose eighth GPU it cannot open: seven GPUs."""
    source = NvmlSource("n1", nvml=FakeNvml.h100_node(7), xid_events=False)
    try:
        return source.read()
    finally:
        source.close()


def test_a_gpu_on_the_bus_that_nvml_does_not_open_is_missing(tmp_path: Path, nvml_snapshot: NodeSnapshot) -> None:
    reader = HardwareReader(root=str(hgx_tree(tmp_path)), proc_root=str(tmp_path / "proc"), expect=Expectation(8))
    hw = reader.enrich(nvml_snapshot).hardware
    assert hw is not None
    assert hw.pci_gpus is not None
    assert len(hw.pci_gpus) == 8
    assert hw.missing_gpus == ("0000:db:00.0",)
    assert (hw.nvml_gpus, hw.gpus_expected, hw.nvswitches) == (7, 8, 4)
    assert len(hw.gpus) == 7  # the NVML source's settings are kept
    text = render_metrics(reader.enrich(nvml_snapshot), ExporterHealth(0.0, 0.0, {})).decode()
    assert 'gpulens_node_gpu_missing{node="n1",pci_bus_id="0000:db:00.0"} 1' in text
    assert 'gpulens_node_pci_gpus{node="n1"} 8' in text
    assert 'gpulens_node_gpus_expected{node="n1"} 8' in text


def test_all_gpus_opened_none_missing_and_no_expectation_exported(tmp_path: Path) -> None:
    source = NvmlSource("n1", nvml=FakeNvml.h100_node(8), xid_events=False)
    snapshot = source.read()
    source.close()
    reader = HardwareReader(root=str(hgx_tree(tmp_path)), proc_root=str(tmp_path))
    hw = reader.enrich(snapshot).hardware
    assert hw is not None
    assert hw.missing_gpus == ()
    assert hw.gpus_expected is None
    text = render_metrics(reader.enrich(snapshot), ExporterHealth(0.0, 0.0, {})).decode()
    assert "gpulens_node_gpu_missing{" not in text
    assert "gpulens_node_gpus_expected{" not in text


def test_an_unreadable_bus_is_unknown_not_empty(tmp_path: Path, nvml_snapshot: NodeSnapshot) -> None:
    hw = HardwareReader(root=str(tmp_path), proc_root=str(tmp_path)).enrich(nvml_snapshot).hardware
    assert hw is not None
    assert hw.pci_gpus is None
    assert hw.missing_gpus == ()
    assert hw.gpus_present() == 7


def test_fabric_manager_from_its_pid_file(tmp_path: Path, nvml_snapshot: NodeSnapshot) -> None:
    root, proc = hgx_tree(tmp_path / "root"), tmp_path / "proc"
    (proc / "4321").mkdir(parents=True)
    (proc / "4321" / "comm").write_text("nv-fabricmanage\n")
    pid_file = root / "run" / "nvidia-fabricmanager" / "nv-fabricmanager.pid"
    pid_file.parent.mkdir(parents=True)
    pid_file.write_text("4321\n")
    clock = ManualClock()
    reader = HardwareReader(root=str(root), proc_root=str(proc), clock=clock)
    assert reader.enrich(nvml_snapshot).hardware.fabric_manager_running is True  # type: ignore[union-attr]
    pid_file.write_text("999\n")  # a stale PID file: the service died
    assert reader.enrich(nvml_snapshot).hardware.fabric_manager_running is True  # type: ignore[union-attr]
    clock.advance(10.0)  # read again after refresh_s
    assert reader.enrich(nvml_snapshot).hardware.fabric_manager_running is False  # type: ignore[union-attr]
    pid_file.unlink()  # no PID file: the processes are scanned
    clock.advance(10.0)
    assert reader.enrich(nvml_snapshot).hardware.fabric_manager_running is True  # type: ignore[union-attr]


def test_no_nvswitch_no_fabric_manager_reading(tmp_path: Path, nvml_snapshot: NodeSnapshot) -> None:
    reader = HardwareReader(root=str(hgx_tree(tmp_path, nvswitches=0)), proc_root=str(tmp_path))
    hw = reader.enrich(nvml_snapshot).hardware
    assert hw is not None
    assert hw.nvswitches == 0
    assert hw.fabric_manager_running is None


def test_peermem_is_read_only_where_rdma_ports_exist(tmp_path: Path, nvml_snapshot: NodeSnapshot) -> None:
    root = hgx_tree(tmp_path)
    expect = Expectation(ib_ports=2, ib_rate_gbps=400)
    hw = HardwareReader(root=str(root), proc_root=str(tmp_path), expect=expect).enrich(nvml_snapshot).hardware
    assert hw is not None
    assert hw.peermem_loaded is None
    nic = NicReading("n1", "mlx5_0", 1, link_layer="InfiniBand", up=True, rate_bytes_per_second=5e10)
    with_port = nvml_snapshot.replace(nics=(nic,))
    reader = HardwareReader(root=str(root), proc_root=str(tmp_path), expect=expect)
    hw = reader.enrich(with_port).hardware
    assert hw is not None
    assert hw.peermem_loaded is False
    assert (hw.ib_ports_expected, hw.ib_rate_expected_bytes_per_second) == (2, 5e10)
    assert (hw.ib_ports_active, hw.ib_ports_slow) == (1, ())
    slow_port = NicReading("n1", "mlx5_1", 1, link_layer="InfiniBand", up=True, rate_bytes_per_second=2.5e10)
    reader = HardwareReader(root=str(root), proc_root=str(tmp_path), expect=expect)
    slow = reader.enrich(nvml_snapshot.replace(nics=(slow_port,))).hardware
    assert slow is not None
    assert slow.ib_ports_slow == (("mlx5_1", 1, 2.5e10),)
    (root / "sys" / "module" / "nvidia_peermem").mkdir(parents=True)
    hw = HardwareReader(root=str(root), proc_root=str(tmp_path)).enrich(with_port).hardware
    assert hw is not None
    assert hw.peermem_loaded is True
    text = render_metrics(reader.enrich(with_port), ExporterHealth(0.0, 0.0, {})).decode()
    assert 'gpulens_node_ib_ports_active{node="n1"} 1' in text
    assert 'gpulens_node_ib_rate_expected_bytes_per_second{node="n1"} 50000000000.0' in text


def test_gpu_settings_and_fabric_state_through_nvml() -> None:
    fake = FakeNvml.h100_node(3)
    fake.gpus[1].persistence_mode = pynvml.NVML_FEATURE_DISABLED
    fake.gpus[1].fabric_state = pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS
    fake.gpus[2].ecc_mode = pynvml.NVML_FEATURE_DISABLED
    fake.gpus[2].fabric_state = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    fake.gpus[2].fabric_status = pynvml.NVML_ERROR_UNKNOWN  # completed, but registration failed
    source = NvmlSource("n1", nvml=fake, xid_events=False)
    snapshot = source.read()
    source.close()
    assert snapshot.hardware is not None
    g0, g1, g2 = snapshot.hardware.gpus
    assert (g0.persistence_mode, g0.ecc_enabled, g0.fabric_ready) == (True, True, True)
    assert (g1.persistence_mode, g1.fabric_state, g1.fabric_ready) == (False, FABRIC_IN_PROGRESS, False)
    assert (g2.ecc_enabled, g2.fabric_ready) == (False, False)
    text = render_metrics(snapshot, ExporterHealth(0.0, 0.0, {})).decode()
    assert f'gpulens_gpu_fabric_ready{{node="n1",gpu="1",uuid="{g1.uuid}",model="NVIDIA H100 80GB HBM3"}} 0' in text
    assert f'gpulens_gpu_persistence_mode{{node="n1",gpu="1",uuid="{g1.uuid}",model="NVIDIA H100 80GB HBM3"}} 0' in text
    assert f'gpulens_gpu_fabric_state{{node="n1",gpu="1",uuid="{g1.uuid}",model="NVIDIA H100 80GB HBM3"}} 2' in text


def test_no_fabric_is_unknown_and_an_old_driver_uses_the_older_call() -> None:
    fake = FakeNvml.h100_node(2)
    fake.gpus[0].fabric_state = None  # NotSupported: a PCIe board, no NVSwitch fabric
    fake.gpus[1].fabric_state = pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
    fake.remove_function("nvmlDeviceGetGpuFabricInfoV")
    source = NvmlSource("n1", nvml=fake, xid_events=False)
    snapshot = source.read()
    source.close()
    assert snapshot.hardware is not None
    assert [(c.fabric_state, c.fabric_ready) for c in snapshot.hardware.gpus] == [(None, None), (None, None)]
    assert fake.calls["nvmlDeviceGetGpuFabricInfo"] == 2
    assert "nvml_not_supported" not in snapshot.errors  # no fabric is an answer, not a failure
    assert "gpulens_gpu_fabric_ready{" not in render_metrics(snapshot, ExporterHealth(0.0, 0.0, {})).decode()


def test_bus_ids_compare_as_sysfs_writes_them() -> None:
    assert sysfs_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert sysfs_bus_id("0001:3b:00.0") == "0001:3b:00.0"
    assert missing_gpus(["0000:3b:00.0", "0001:3b:00.0"], ["00000000:3B:00.0", None]) == ("0001:3b:00.0",)


def test_the_snapshot_document_carries_the_hardware_to_the_collector(nvml_snapshot: NodeSnapshot) -> None:
    from gpulens.snapshotcodec import LAYOUTS, snapshot_from_bytes, snapshot_to_bytes

    snapshot = nvml_snapshot.replace(
        hardware=NodeHardware(pci_gpus=("0000:18:00.0",), missing_gpus=("0000:18:00.0",), nvswitches=4)
    )
    for layout in LAYOUTS:
        assert snapshot_from_bytes(snapshot_to_bytes(snapshot, layout=layout)).hardware == snapshot.hardware
    assert snapshot_from_bytes(snapshot_to_bytes(snapshot.replace(hardware=None))).hardware is None


class _Node:
    """One node as the collector sees it: the agent's snapshot through the JSON document, at any time."""

    def __init__(self, body: bytes) -> None:
        self._body = body

    def node_names(self) -> list[str]:
        return ["n1"]

    def snapshot(self, node: str, t: float) -> NodeSnapshot:
        from gpulens.snapshotcodec import snapshot_from_bytes

        return snapshot_from_bytes(self._body).replace(timestamp=t)


def test_eight_gpus_on_the_bus_seven_in_nvml_fire_gpu_missing_naming_the_address(
    tmp_path: Path, nvml_snapshot: NodeSnapshot
) -> None:
    from gpulens.alerts.replay import replay
    from gpulens.alerts.rules import builtin_rules
    from gpulens.snapshotcodec import snapshot_to_bytes

    reader = HardwareReader(root=str(hgx_tree(tmp_path)), proc_root=str(tmp_path))
    body = snapshot_to_bytes(reader.enrich(nvml_snapshot), layout="columnar")
    report = replay(_Node(body), start=0.0, end=300.0, step_s=10.0, rules=builtin_rules())
    missing = [a for a in report.alerts if a.alertname == "GpuMissing"]
    assert [(a.labels["node"], a.labels["pci_bus_id"], a.labels["severity"]) for a in missing] == [
        ("n1", "0000:db:00.0", "critical")
    ]
    assert missing[0].starts_at == 60.0  # its `for`
