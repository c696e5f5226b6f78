"""Host and job CPU/memory: /proc/stat deltas, /proc/meminfo, cgroup v2 and v1 job directories."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from gpulens.exporter.fabric.host import (
    CpuTimes,
    HostReader,
    JobHostReader,
    cpu_ratios,
    job_cgroup,
    parse_cgroup_file,
    parse_proc_stat,
)
from gpulens.fabricmodel import HostReading, JobHostReading
from tests.exporter.fabric.conftest import STAT_LATER, V1_CGROUP, V1_PROC, V2_CGROUP, V2_PROC

KIB = 1024
GIB = 1 << 30
MEM_TOTAL = 2113322068 * KIB
MEM_AVAILABLE = 1987654321 * KIB
SLURM_PIDS = list(range(4101, 4108))


def test_first_read_has_memory_but_no_cpu_ratios() -> None:
    reader = HostReader("n", proc_root=str(V2_PROC))
    assert reader.read() == HostReading(
        node="n",
        cpus=16,
        cpu_busy_ratio=None,
        cpu_iowait_ratio=None,
        memory_total_bytes=MEM_TOTAL,
        memory_used_bytes=MEM_TOTAL - MEM_AVAILABLE,
        memory_available_bytes=MEM_AVAILABLE,
    )
    assert reader.errors == {}


def test_ratios_from_two_stat_snapshots(proc_v2: Path) -> None:
    reader = HostReader("n", proc_root=str(proc_v2 / "proc"))
    reader.read()
    shutil.copy(STAT_LATER, proc_v2 / "proc" / "stat")
    # between the two: user +600, system +200, idle +1000, iowait +100, softirq +100 ticks: 2000 in all
    reading = reader.read()
    assert reading.cpu_busy_ratio == pytest.approx(900 / 2000)
    assert reading.cpu_iowait_ratio == pytest.approx(100 / 2000)
    assert reading.cpus == 16
    unchanged = reader.read()  # no tick elapsed since: no ratio rather than 0/0
    assert (unchanged.cpu_busy_ratio, unchanged.cpu_iowait_ratio) == (None, None)


def test_parse_proc_stat_and_ratios() -> None:
    times = parse_proc_stat("cpu  10 0 5 80 5 0 0 0 0 0\ncpu0 10 0 5 80 5 0 0 0 0 0\nintr 1\n")
    assert times == CpuTimes(total=100, idle=85, iowait=5, cpus=1)
    later = CpuTimes(total=200, idle=175, iowait=3, cpus=1)  # iowait stepped back: clamped to zero
    assert cpu_ratios(times, later) == (0.1, 0.0)
    assert cpu_ratios(later, times) is None
    assert parse_proc_stat("cpu  10 x 5 80 5\n") is None
    assert parse_proc_stat("intr 1\n") is None


def test_garbled_and_missing_proc_files_are_none_and_counted(proc_v2: Path) -> None:
    (proc_v2 / "proc" / "stat").write_text("cpu  lots of time\n")
    (proc_v2 / "proc" / "meminfo").unlink()
    reader = HostReader("n", proc_root=str(proc_v2 / "proc"))
    assert reader.read() == HostReading(node="n")
    assert reader.errors == {"host_malformed": 1, "host_missing": 1}


def test_meminfo_without_memavailable(proc_v2: Path) -> None:
    (proc_v2 / "proc" / "meminfo").write_text("MemTotal:       1024 kB\nMemFree:         512 kB\n")
    reading = HostReader("n", proc_root=str(proc_v2 / "proc")).read()
    assert (reading.memory_total_bytes, reading.memory_used_bytes, reading.memory_available_bytes) == (
        1024 * KIB,
        None,
        None,
    )


def v2_reader(root: Path | None = None) -> JobHostReader:
    proc, cgroup = (V2_PROC, V2_CGROUP) if root is None else (root / "proc", root / "cgroup")
    return JobHostReader("n", proc_root=str(proc), cgroup_root=str(cgroup))


def test_v2_jobs_one_reading_each() -> None:
    reader = v2_reader()
    assert reader.unified
    jobs = reader.read([*SLURM_PIDS, 4120, 5201, 812, 999999])
    assert [j.job_id for j in jobs] == [*(str(4242 + i) for i in range(7)), "pod/7c1f2d9e-5b3a-4c8d-9e0f-1a2b3c4d5e6f"]
    assert jobs[0] == JobHostReading(
        node="n",
        job_id="4242",
        cgroup="/system.slice/slurmstepd.scope/job_4242",
        cgroup_version=2,
        cpu_seconds_total=123.456789,
        cpu_limit_cores=16.0,
        memory_used_bytes=64 * GIB,
        memory_limit_bytes=128 * GIB,
    )
    assert (jobs[1].cpu_limit_cores, jobs[1].memory_used_bytes) == (14.0, 65 * GIB)
    assert (jobs[3].cpu_limit_cores, jobs[3].memory_limit_bytes) == (None, None)  # "max 100000", "max"
    pod = jobs[-1]
    assert pod.cgroup == (
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7c1f2d9e_5b3a_4c8d_9e0f_1a2b3c4d5e6f.slice"
    )
    assert (pod.cpu_seconds_total, pod.cpu_limit_cores) == (987.654321, None)
    assert (pod.memory_used_bytes, pod.memory_limit_bytes) == (16 * GIB, None)
    assert reader.errors == {}  # an exited pid (999999) and a pid in no job (812) are not errors


def test_v1_jobs() -> None:
    reader = JobHostReader("n", proc_root=str(V1_PROC), cgroup_root=str(V1_CGROUP))
    assert not reader.unified
    jobs = reader.read([7001, 7002])
    assert jobs == (
        JobHostReading(
            node="n",
            job_id="777",
            cgroup="/slurm/uid_1000/job_777",
            cgroup_version=1,
            cpu_seconds_total=5000.0,  # cpuacct.usage 5e12 ns
            cpu_limit_cores=8.0,  # cfs quota 800000 / period 100000
            memory_used_bytes=GIB,
            memory_limit_bytes=None,  # 9223372036854771712: v1's "no limit"
        ),
        JobHostReading(
            node="n",
            job_id="778",
            cgroup="/slurm/uid_1000/job_778",
            cgroup_version=1,
            cpu_seconds_total=42.0,
            cpu_limit_cores=None,  # quota -1
            memory_used_bytes=3 * GIB,
            memory_limit_bytes=32 * GIB,
        ),
    )
    assert reader.errors == {}


@pytest.mark.parametrize(
    ("path", "job_id", "expected"),
    [
        (
            "/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0",
            "4242",
            "/system.slice/slurmstepd.scope/job_4242",
        ),
        ("/slurm/uid_1000/job_777/step_0/task_0", "777", "/slurm/uid_1000/job_777"),
        ("/slurm_node7/uid_1000/job_12_3/step_batch", "12_3", "/slurm_node7/uid_1000/job_12_3"),
        (
            "/kubepods/burstable/pod7c1f2d9e-5b3a-4c8d-9e0f-1a2b3c4d5e6f/" + "ab" * 32,
            "pod/7c1f2d9e-5b3a-4c8d-9e0f-1a2b3c4d5e6f",
            "/kubepods/burstable/pod7c1f2d9e-5b3a-4c8d-9e0f-1a2b3c4d5e6f",
        ),
        (
            "/system.slice/docker-" + "c" * 64 + ".scope",
            "docker/" + "c" * 12,
            "/system.slice/docker-" + "c" * 64 + ".scope",
        ),
        ("/system.slice/sshd.service", "4242", None),
        ("/slurm/uid_1000/job_777/step_0", "778", None),
    ],
)
def test_job_cgroup_cuts_at_the_job(path: str, job_id: str, expected: str | None) -> None:
    assert job_cgroup(path, job_id) == expected


def test_parse_cgroup_file() -> None:
    assert parse_cgroup_file("0::/a/b\n") == [("0", (), "/a/b")]
    assert parse_cgroup_file("7:cpu,cpuacct:/slurm/job_1\n1:name=systemd:/x\n") == [
        ("7", ("cpu", "cpuacct"), "/slurm/job_1"),
        ("1", ("name=systemd",), "/x"),
    ]
    assert parse_cgroup_file("garbage\n") is None
    assert parse_cgroup_file("0::relative\n") is None
    assert parse_cgroup_file("\n") is None


def test_garbled_cgroup_files_are_none_and_counted(proc_v2: Path) -> None:
    job = proc_v2 / "cgroup" / "system.slice" / "slurmstepd.scope" / "job_4242"
    (job / "cpu.stat").write_text("user_usec 5\n")
    (job / "cpu.max").write_text("lots\n")
    (job / "memory.max").write_text("unlimited\n")
    (job / "memory.current").write_text("-5\n")
    (proc_v2 / "proc" / "4102" / "cgroup").write_text("not a cgroup line\n")
    reader = v2_reader(proc_v2)
    jobs = reader.read([4101, 4102, 4103])
    assert [j.job_id for j in jobs] == ["4242", "4244"]
    first = jobs[0]
    assert (first.cpu_seconds_total, first.cpu_limit_cores, first.memory_used_bytes, first.memory_limit_bytes) == (
        None,
        None,
        None,
        None,
    )
    assert reader.errors == {"host_malformed": 5}


def test_v1_missing_controller_files(tmp_path: Path) -> None:
    root = tmp_path / "v1"
    shutil.copytree(V1_PROC.parent, root, symlinks=True)
    shutil.rmtree(root / "cgroup" / "memory")
    reader = JobHostReader("n", proc_root=str(root / "proc"), cgroup_root=str(root / "cgroup"))
    (job,) = reader.read([7001])
    assert (job.cpu_seconds_total, job.memory_used_bytes, job.memory_limit_bytes) == (5000.0, None, None)
    assert reader.errors == {}


def test_never_opens_environ_or_cmdline(monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []
    real_open = os.open

    def spy(path: str, flags: int, *args: int, **kwargs: int) -> int:
        opened.append(os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    v2_reader().read([*SLURM_PIDS, 4120, 5201, 812])
    HostReader("n", proc_root=str(V2_PROC)).read()
    assert opened
    assert all(not p.endswith(("/environ", "/cmdline")) for p in opened)
    assert {p for p in opened if p.startswith(str(V2_PROC) + "/4")} == {
        f"{V2_PROC}/{pid}/cgroup" for pid in [*SLURM_PIDS, 4120]
    }
