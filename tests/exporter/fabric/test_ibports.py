"""RDMA port reader: every port under sys/class/infiniband, counters in bytes, failures counted, never raised."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from gpulens.exporter.fabric.ibports import IbPortReader, parse_rate, parse_state
from gpulens.fabricmodel import NicReading, port_is_up
from tests.exporter.fabric.conftest import SYSFS, port_dir


def by_device(readings: tuple[NicReading, ...]) -> dict[str, NicReading]:
    return {r.device: r for r in readings}


def test_reads_every_port_in_device_order() -> None:
    reader = IbPortReader("gpu-node-01", root=str(SYSFS))
    readings = reader.read()
    assert [(r.device, r.port) for r in readings] == [(f"mlx5_{i}", 1) for i in range(10)]
    assert {r.node for r in readings} == {"gpu-node-01"}
    assert reader.errors == {}


def test_ndr_port_exact_values_and_word_counters_in_bytes() -> None:
    nic = by_device(IbPortReader("n", root=str(SYSFS)).read())["mlx5_0"]
    assert nic == NicReading(
        node="n",
        device="mlx5_0",
        port=1,
        link_layer="InfiniBand",
        state="ACTIVE",
        phys_state="LinkUp",
        up=True,
        rate_bytes_per_second=50e9,  # 400 Gb/s
        link_width=4,
        link_speed="NDR",
        transmit_bytes_total=4000,  # port_xmit_data 1000 words of 4 bytes
        receive_bytes_total=8000,  # port_rcv_data 2000
        transmit_packets_total=30,
        receive_packets_total=40,
        transmit_wait_total=55,
        symbol_errors_total=0,
        link_downed_total=1,
        link_error_recovery_total=0,
        receive_errors_total=2,
        local_link_integrity_errors_total=0,
        excessive_buffer_overrun_errors_total=0,
        transmit_discards_total=3,
        cnp_sent_total=None,  # InfiniBand ports have no congestion notification packets
        cnp_handled_total=None,
        out_of_sequence_total=5,
        packet_sequence_errors_total=6,
        local_ack_timeouts_total=7,
        saturated_counters=(),
        pci_bus_id="0000:17:00.0",
        numa_node=0,
        gpus=(),
    )


def test_64_bit_counters_are_taken_whole() -> None:
    nic = by_device(IbPortReader("n", root=str(SYSFS)).read())["mlx5_3"]
    assert nic.transmit_bytes_total == (7201903772212 + 3 * 1_000_003) * 4
    assert nic.receive_packets_total == 1757669231 + 3 * 103
    assert nic.transmit_bytes_total > 2**32
    assert nic.symbol_errors_total == 0
    assert nic.link_error_recovery_total == 1
    assert (nic.pci_bus_id, nic.numa_node) == ("0000:77:00.0", 0)


def test_roce_port_has_congestion_counters() -> None:
    nic = by_device(IbPortReader("n", root=str(SYSFS)).read())["mlx5_8"]
    assert nic.link_layer == "Ethernet"
    assert nic.is_roce
    assert nic.up
    assert (nic.rate_bytes_per_second, nic.link_width, nic.link_speed) == (25e9, 4, "HDR")
    assert (nic.cnp_sent_total, nic.cnp_handled_total) == (1234, 1200)
    assert (nic.out_of_sequence_total, nic.packet_sequence_errors_total, nic.local_ack_timeouts_total) == (17, 3, 9)
    assert nic.transmit_bytes_total == 250_000_000_000 * 4
    assert nic.transmit_discards_total == 4
    assert (nic.pci_bus_id, nic.numa_node) == ("0000:e1:00.0", 1)


def test_down_port_is_not_up() -> None:
    nic = by_device(IbPortReader("n", root=str(SYSFS)).read())["mlx5_9"]
    assert (nic.state, nic.phys_state, nic.up) == ("DOWN", "Polling", False)
    assert nic.link_downed_total == 2
    assert nic.rate_bytes_per_second == 1.25e9


def test_up_needs_both_states() -> None:
    assert port_is_up("ACTIVE", "LinkUp")
    assert not port_is_up("ACTIVE", "Polling")
    assert not port_is_up("INIT", "LinkUp")
    assert not port_is_up(None, "LinkUp")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("400 Gb/sec (4X NDR)", (50e9, 4, "NDR")),
        ("800 Gb/sec (4X XDR)", (100e9, 4, "XDR")),
        ("2.5 Gb/sec (1X SDR)", (312_500_000.0, 1, "SDR")),
        ("10 Gb/sec (4X)", (1.25e9, 4, None)),
        ("100 Gb/sec", (12.5e9, None, None)),
        ("fast", None),
        ("400 Mb/sec (4X NDR)", None),
    ],
)
def test_parse_rate(text: str, expected: tuple[float, int | None, str | None] | None) -> None:
    assert parse_rate(text) == expected


def test_parse_state() -> None:
    assert parse_state("4: ACTIVE") == "ACTIVE"
    assert parse_state("5: LinkUp") == "LinkUp"
    assert parse_state("ACTIVE") is None


def test_devices_in_natural_order(sysfs: Path) -> None:
    class_dir = sysfs / "sys" / "class" / "infiniband"
    (class_dir / "mlx5_9").rename(class_dir / "mlx5_10")  # a node with 11 devices lists mlx5_10 last
    (class_dir / "ib0").symlink_to(class_dir / "mlx5_10")
    devices = [r.device for r in IbPortReader("n", root=str(sysfs)).read()]
    assert devices == ["ib0", *(f"mlx5_{i}" for i in range(9)), "mlx5_10"]


def test_a_name_that_moves_to_another_function_is_followed(sysfs: Path) -> None:
    class_dir = sysfs / "sys" / "class" / "infiniband"
    reader = IbPortReader("n", root=str(sysfs))
    assert by_device(reader.read())["mlx5_0"].pci_bus_id == "0000:17:00.0"
    target = os.readlink(class_dir / "mlx5_9")
    (class_dir / "mlx5_9").unlink()
    (class_dir / "mlx5_0").unlink()
    (class_dir / "mlx5_0").symlink_to(target)  # after a driver reload, the name mlx5_0 is the other HCA
    moved = by_device(reader.read())["mlx5_0"]
    assert (moved.pci_bus_id, moved.state, moved.link_downed_total) == ("0000:e9:00.0", "DOWN", 2)


def test_no_rdma_devices_is_empty_not_an_error(tmp_path: Path) -> None:
    reader = IbPortReader("n", root=str(tmp_path))
    assert reader.read() == ()
    assert reader.errors == {}


def test_missing_files_are_none_without_errors(sysfs: Path) -> None:
    port = port_dir(sysfs, "mlx5_0")
    (port / "counters" / "port_xmit_data").unlink()
    (port / "rate").unlink()
    shutil.rmtree(port / "hw_counters")
    reader = IbPortReader("n", root=str(sysfs))
    nic = by_device(reader.read())["mlx5_0"]
    assert nic.transmit_bytes_total is None
    assert nic.receive_bytes_total == 8000
    assert (nic.rate_bytes_per_second, nic.link_width, nic.link_speed) == (None, None, None)
    assert (nic.out_of_sequence_total, nic.local_ack_timeouts_total) == (None, None)
    assert reader.errors == {}


def test_garbled_files_are_none_and_counted(sysfs: Path) -> None:
    port = port_dir(sysfs, "mlx5_1")
    (port / "counters" / "port_rcv_data").write_text("garbage\n")
    (port / "counters" / "link_downed").write_text("-1\n")
    (port / "rate").write_text("fast\n")
    (port / "state").write_text("ACTIVE\n")
    reader = IbPortReader("n", root=str(sysfs))
    readings = reader.read()
    nic = by_device(readings)["mlx5_1"]
    assert (nic.receive_bytes_total, nic.link_downed_total, nic.rate_bytes_per_second, nic.state) == (None,) * 4
    assert nic.up is False
    assert nic.transmit_bytes_total == (7201903772212 + 1_000_003) * 4  # the rest of the port still reads
    assert len(readings) == 10
    assert reader.errors == {"ib_malformed": 4}


def test_unavailable_and_unreadable_counters_are_counted(sysfs: Path) -> None:
    port = port_dir(sysfs, "mlx5_2")
    (port / "counters" / "port_xmit_wait").write_text("N/A (no PMA)\n")
    (port / "counters" / "symbol_error").unlink()
    (port / "counters" / "symbol_error").mkdir()  # reading a directory fails like an unreadable attribute
    reader = IbPortReader("n", root=str(sysfs))
    nic = by_device(reader.read())["mlx5_2"]
    assert (nic.transmit_wait_total, nic.symbol_errors_total) == (None, None)
    assert reader.errors == {"ib_unavailable": 1, "ib_read_error": 1}
    reader.read()
    assert reader.errors == {"ib_unavailable": 2, "ib_read_error": 2}  # cumulative


def test_saturated_legacy_counters_are_noted(sysfs: Path) -> None:
    port = port_dir(sysfs, "mlx5_4")
    (port / "counters" / "port_xmit_data").write_text(f"{0xFFFFFFFF}\n")
    (port / "counters" / "symbol_error").write_text(f"{0xFFFF}\n")
    (port / "counters" / "link_downed").write_text(f"{0xFF}\n")
    reader = IbPortReader("n", root=str(sysfs))
    nic = by_device(reader.read())["mlx5_4"]
    assert nic.saturated_counters == ("port_xmit_data", "symbol_error", "link_downed")
    assert nic.transmit_bytes_total == 0xFFFFFFFF * 4  # still reported: the value is what the port says
    assert nic.symbol_errors_total == 0xFFFF
    assert reader.errors == {"ib_saturated": 1}


def test_counters_ext_is_preferred_on_old_kernels(sysfs: Path) -> None:
    port = port_dir(sysfs, "mlx5_5")
    (port / "counters" / "port_xmit_data").write_text(f"{0xFFFFFFFF}\n")
    (port / "counters_ext").mkdir()
    (port / "counters_ext" / "port_xmit_data_64").write_text("5000000000\n")
    (port / "counters_ext" / "port_rcv_packets_64").write_text("6000000000\n")
    reader = IbPortReader("n", root=str(sysfs))
    nic = by_device(reader.read())["mlx5_5"]
    assert nic.transmit_bytes_total == 20_000_000_000
    assert nic.receive_packets_total == 6_000_000_000
    assert nic.receive_bytes_total == (7199412238810 + 5 * 999_983) * 4  # no _64 file: the counters/ value
    assert nic.saturated_counters == ()
    assert reader.errors == {}


def test_device_without_pci_link_has_no_place(sysfs: Path) -> None:
    device = sysfs / "sys" / "class" / "infiniband" / "mlx5_6"
    (device / "device").unlink()
    nic = by_device(IbPortReader("n", root=str(sysfs)).read())["mlx5_6"]
    assert (nic.pci_bus_id, nic.numa_node) == (None, None)
    assert nic.transmit_bytes_total is not None
