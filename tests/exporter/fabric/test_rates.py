"""Rates at the source: port traffic, wait and CNPs per second, and a job's CPU cores, across two reads of the same
port or job with an injected clock; None first, after a reset and for a saturated counter."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulens.clock import ManualClock
from gpulens.exporter.fabric.host import JobHostReader
from gpulens.exporter.fabric.ibports import IbPortReader
from gpulens.fabricmodel import NicReading
from tests.exporter.fabric.conftest import port_dir


def by_device(readings: tuple[NicReading, ...]) -> dict[str, NicReading]:
    return {r.device: r for r in readings}


def bump(path: Path, by: int) -> None:
    path.write_text(f"{int(path.read_text()) + by}\n")


def test_first_read_has_no_rates(sysfs: Path) -> None:
    nic = by_device(IbPortReader("n", root=str(sysfs), clock=ManualClock()).read())["mlx5_0"]
    rates = (nic.transmit_bytes_per_second, nic.receive_bytes_per_second, nic.transmit_wait_per_second)
    assert rates == (None, None, None)
    assert nic.cnp_handled_per_second is None


def test_word_counters_become_bytes_per_second_across_two_reads(sysfs: Path) -> None:
    clock = ManualClock()
    reader = IbPortReader("n", root=str(sysfs), clock=clock)
    first = by_device(reader.read())["mlx5_0"]
    counters = port_dir(sysfs, "mlx5_0") / "counters"
    bump(counters / "port_xmit_data", 250)  # 250 four-byte words: 1,000 bytes
    bump(counters / "port_rcv_data", 1000)  # 4,000 bytes
    bump(counters / "port_xmit_wait", 30)
    clock.advance(2.0)
    second = by_device(reader.read())["mlx5_0"]
    assert second.transmit_bytes_total - first.transmit_bytes_total == 1000
    assert second.receive_bytes_total - first.receive_bytes_total == 4000
    assert second.transmit_bytes_per_second == pytest.approx(500.0)
    assert second.receive_bytes_per_second == pytest.approx(2000.0)
    assert second.transmit_wait_per_second == pytest.approx(15.0)
    assert second.cnp_handled_per_second is None  # an InfiniBand port has no CNP counter
    idle = by_device(reader.read())["mlx5_1"]  # no time elapsed since the previous read: no rate
    assert idle.transmit_bytes_per_second is None


def test_64_bit_counters_rate(sysfs: Path) -> None:
    clock = ManualClock()
    reader = IbPortReader("n", root=str(sysfs), clock=clock)
    reader.read()
    bump(port_dir(sysfs, "mlx5_3") / "counters" / "port_xmit_data", 12_500_000_000 // 4)
    clock.advance(1.0)
    nic = by_device(reader.read())["mlx5_3"]
    assert nic.transmit_bytes_total > 2**32
    assert nic.transmit_bytes_per_second == pytest.approx(12.5e9)  # a quarter of 400 Gb/s
    assert nic.receive_bytes_per_second == 0.0


def test_roce_cnp_handled_rate(sysfs: Path) -> None:
    clock = ManualClock()
    reader = IbPortReader("n", root=str(sysfs), clock=clock)
    reader.read()
    bump(port_dir(sysfs, "mlx5_8") / "hw_counters" / "rp_cnp_handled", 600)
    clock.advance(3.0)
    assert by_device(reader.read())["mlx5_8"].cnp_handled_per_second == pytest.approx(200.0)


def test_a_counter_that_went_down_is_a_reset_then_rates_resume(sysfs: Path) -> None:
    clock = ManualClock()
    reader = IbPortReader("n", root=str(sysfs), clock=clock)
    reader.read()
    counters = port_dir(sysfs, "mlx5_0") / "counters"
    (counters / "port_xmit_data").write_text("10\n")  # perfquery -R
    clock.advance(1.0)
    assert by_device(reader.read())["mlx5_0"].transmit_bytes_per_second is None
    bump(counters / "port_xmit_data", 5)
    clock.advance(1.0)
    assert by_device(reader.read())["mlx5_0"].transmit_bytes_per_second == pytest.approx(20.0)


def test_a_saturated_counter_has_no_rate(sysfs: Path) -> None:
    clock = ManualClock()
    reader = IbPortReader("n", root=str(sysfs), clock=clock)
    reader.read()
    counters = port_dir(sysfs, "mlx5_0") / "counters"
    (counters / "port_xmit_data").write_text(f"{0xFFFFFFFF}\n")  # stopped at the 32-bit maximum: it went up
    bump(counters / "port_rcv_data", 10)
    clock.advance(1.0)
    nic = by_device(reader.read())["mlx5_0"]
    assert nic.saturated_counters == ("port_xmit_data",)
    assert nic.transmit_bytes_per_second is None
    assert nic.receive_bytes_per_second == pytest.approx(40.0)


def cpu_stat(root: Path, job: str) -> Path:
    return root / "cgroup" / "system.slice" / "slurmstepd.scope" / f"job_{job}" / "cpu.stat"


def set_usage(path: Path, usec: int) -> None:
    lines = path.read_text().splitlines()
    path.write_text("\n".join(f"usage_usec {usec}" if ln.startswith("usage_usec ") else ln for ln in lines) + "\n")


def test_job_cpu_cores_across_two_reads(proc_v2: Path) -> None:
    clock = ManualClock()
    reader = JobHostReader("n", proc_root=str(proc_v2 / "proc"), cgroup_root=str(proc_v2 / "cgroup"), clock=clock)
    first = {j.job_id: j for j in reader.read([4101, 4102])}
    assert first["4242"].cpu_used_cores is None
    set_usage(cpu_stat(proc_v2, "4242"), 123_456_789 + 6_000_000)  # 6 CPU seconds
    clock.advance(2.0)
    second = {j.job_id: j for j in reader.read([4101, 4102])}
    assert second["4242"].cpu_used_cores == pytest.approx(3.0)
    assert second["4243"].cpu_used_cores == 0.0
    set_usage(cpu_stat(proc_v2, "4242"), 1_000_000)  # a new cgroup under the same job id: a reset
    clock.advance(2.0)
    assert {j.job_id: j for j in reader.read([4101])}["4242"].cpu_used_cores is None


def test_a_job_that_left_starts_afresh(proc_v2: Path) -> None:
    clock = ManualClock()
    reader = JobHostReader("n", proc_root=str(proc_v2 / "proc"), cgroup_root=str(proc_v2 / "cgroup"), clock=clock)
    reader.read([4101])
    clock.advance(1.0)
    assert reader.read([4102])[0].cpu_used_cores is None  # job 4243's first read
    clock.advance(1.0)
    assert reader.read([4101])[0].cpu_used_cores is None  # job 4242 was not read last time: no stale baseline
