"""Tests for gpulens.exporter.jobmap: fixture /proc trees and job-map directories built in tmp_path."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pwd
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gpulens.exporter.fabric.host import job_cgroup
from gpulens.exporter.jobmap import JobMapper, job_id_from_cgroup_paths
from gpulens.model import GpuJob, GpuReading, NodeSnapshot, ProcessReading
from gpulens.snapshotcodec import snapshot_to_json

NODE = "node07"
UUIDS = (
    "GPU-11111111-2222-3333-4444-000000000000",
    "GPU-11111111-2222-3333-4444-000000000001",
    "GPU-11111111-2222-3333-4444-000000000002",
)
SECRET = "hunter2-AWS_SECRET_ACCESS_KEY-7f3a"
USERS = {1000: "alice", 1001: "bob"}
POD_UID = "0a1b2c3d-4e5f-6789-abcd-ef0123456789"
CONTAINER = "3f4e5d6c7b8a" + "0123456789abcdef" * 3 + "0123"  # 64 hex digits
PLAIN_CGROUP = "0::/user.slice/user-1000.slice/session-3.scope\n"
SLURM_V1_CGROUP = "".join(
    f"{n}:{controller}:/slurm/uid_1000/job_4242/step_0/task_0\n"
    for n, controller in enumerate(("cpu,cpuacct", "memory", "devices", "freezer"), start=2)
) + ("1:name=systemd:/system.slice/slurmd.service\n0::/system.slice/slurmd.service\n")


# --- fixtures and builders -------------------------------------------------------------------------------------------


def write_process(
    proc: Path,
    pid: int,
    *,
    cgroup: str = PLAIN_CGROUP,
    uid: int = 1000,
    comm: str = "python3",
    start_time: int = 81234,
    status: str | None = None,
) -> Path:
    """A /proc/<pid> directory as the kernel lays it out, with a secret in environ and cmdline."""
    directory = proc / str(pid)
    directory.mkdir(parents=True)
    fields = ["S", "1", str(pid), str(pid), "0", "-1", "4194560", "120", "0", "3", "0", "52", "17", "0", "0", "20"]
    fields += ["0", "4", "0", str(start_time), "9000000", "2100"]
    (directory / "stat").write_text(f"{pid} ({comm[:15]}) {' '.join(fields)}\n")
    (directory / "cgroup").write_text(cgroup)
    if status is None:
        status = f"Name:\t{comm[:15]}\nState:\tS (sleeping)\nPid:\t{pid}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t100\n"
    (directory / "status").write_text(status)
    (directory / "comm").write_text(comm + "\n")
    (directory / "environ").write_bytes(f"HOME=/home/alice\0API_TOKEN={SECRET}\0".encode())
    (directory / "cmdline").write_bytes(f"python3\0train.py\0--password={SECRET}\0".encode())
    return directory


def gpu(index: int) -> GpuReading:
    return GpuReading(node=NODE, gpu=index, uuid=UUIDS[index], model="H100-SXM5-80GB", timestamp=1_700_000_000.0)


def process(pid: int, index: int = 0, **fields: Any) -> ProcessReading:
    return ProcessReading(node=NODE, gpu=index, uuid=UUIDS[index], pid=pid, memory_used_bytes=2 << 30, **fields)


def snapshot(
    *processes: ProcessReading, jobs: tuple[GpuJob, ...] = (), errors: dict[str, int] | None = None
) -> NodeSnapshot:
    return NodeSnapshot(
        node=NODE,
        timestamp=1_700_000_000.0,
        source="nvml",
        gpus=tuple(gpu(i) for i in range(len(UUIDS))),
        processes=processes,
        jobs=jobs,
        errors=errors or {},
    )


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    root.mkdir()
    return root


@pytest.fixture
def jobmap(tmp_path: Path) -> Path:
    root = tmp_path / "gpustat"
    root.mkdir()
    return root


def mapper(proc: Path, job_map_dir: Path | None = None) -> JobMapper:
    return JobMapper(proc_root=proc, job_map_dir=job_map_dir, user_lookup=USERS.get)


def only(result: NodeSnapshot, pid: int) -> ProcessReading:
    (found,) = [p for p in result.processes if p.pid == pid]
    return found


def job_keys(result: NodeSnapshot) -> list[tuple[int, str, str | None]]:
    return [(j.gpu, j.job_id, j.user) for j in result.jobs]


# --- an audit of every file the mapper opens --------------------------------------------------------------------------
# Python raises the "open" audit event for builtins.open, io.open, os.open and pathlib alike, before the file is
# opened. Recording it shows exactly which files the mapper opens, whatever API a future change uses, without
# patching the mapper and without a FIFO that would hang the test if the code regressed. Audit hooks cannot be removed,
# so one hook is installed once and records only while a recording is active.

_recordings: list[list[str]] = []
_hook_installed = False


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and _recordings and isinstance(args[0], str | bytes | os.PathLike):
        _recordings[-1].append(os.fsdecode(args[0]))


@contextmanager
def opened_files() -> Iterator[list[str]]:
    global _hook_installed
    if not _hook_installed:
        sys.addaudithook(_audit)
        _hook_installed = True
    record: list[str] = []
    _recordings.append(record)
    try:
        yield record
    finally:
        _recordings.remove(record)


def under(paths: list[str], root: Path) -> list[str]:
    """The opened paths below ``root``, relative to it."""
    return sorted(str(Path(p).relative_to(root)) for p in paths if Path(p).is_relative_to(root))


# --- job ids from cgroup paths ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cgroup", "expected"),
    [
        pytest.param(SLURM_V1_CGROUP, "4242", id="slurm-v1"),
        pytest.param("4:memory:/slurm_node07/uid_1000/job_77/step_batch/task_0\n", "77", id="slurm-v1-multi-slurmd"),
        pytest.param("0::/system.slice/slurmstepd.scope/job_4243/step_0/user/task_0\n", "4243", id="slurm-v2"),
        pytest.param("0::/system.slice/node07_slurmstepd.scope/job_88/step_0/user/task_0\n", "88", id="slurm-v2-host"),
        pytest.param("0::/system.slice/slurmstepd.scope/job_123_4/step_extern/user\n", "123_4", id="slurm-array"),
        pytest.param(f"0::/kubepods/burstable/pod{POD_UID}/{CONTAINER}\n", f"pod/{POD_UID}", id="k8s-cgroupfs"),
        pytest.param(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            f"{POD_UID.replace('-', '_')}.slice/cri-containerd-{CONTAINER}.scope\n",
            f"pod/{POD_UID}",
            id="k8s-systemd",
        ),
        pytest.param(
            f"0::/kubepods.slice/kubepods-pod{POD_UID.replace('-', '_')}.slice/crio-{CONTAINER}.scope\n",
            f"pod/{POD_UID}",
            id="k8s-systemd-guaranteed",
        ),
        pytest.param(f"0::/system.slice/docker-{CONTAINER}.scope\n", f"docker/{CONTAINER[:12]}", id="docker-systemd"),
        pytest.param(
            f"12:memory:/docker/{CONTAINER}\n11:pids:/docker/{CONTAINER}\n", f"docker/{CONTAINER[:12]}", id="docker-v1"
        ),
        pytest.param(PLAIN_CGROUP, None, id="plain"),
        pytest.param("0::/system.slice/job_5.service\n", None, id="job-without-slurm"),
        pytest.param("0::/docker/3f4e5d6c7b8a\n", None, id="docker-short-id"),
    ],
)
def test_job_id_comes_from_the_cgroup_file(proc: Path, cgroup: str, expected: str | None) -> None:
    write_process(proc, 4100, cgroup=cgroup)
    result = mapper(proc).enrich(snapshot(process(4100)))
    assert only(result, 4100).job_id == expected
    assert result.errors == {}


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        pytest.param(
            f"/kubepods/burstable/pod{POD_UID}/{CONTAINER}/slurm/uid_0/job_999/step_0",
            f"pod/{POD_UID}",
            id="slurm-v1-look-alike-inside-a-pod",
        ),
        pytest.param(
            f"/kubepods.slice/kubepods-pod{POD_UID.replace('-', '_')}.slice/system.slice/slurmstepd.scope/job_1/step_0",
            f"pod/{POD_UID}",
            id="slurm-v2-look-alike-inside-a-pod",
        ),
        pytest.param(
            f"/system.slice/slurmstepd.scope/job_77/step_0/kubepods/pod{POD_UID}/x",
            "77",
            id="pod-look-alike-inside-a-slurm-job",
        ),
        pytest.param("/user.slice/user-1000.slice/slurm/uid_1000/job_5/step_0", None, id="slurm-not-at-its-root"),
        pytest.param("/user.slice/slurmstepd.scope/job_5", None, id="slurmstepd-not-at-its-root"),
        pytest.param("/system.slice/slurmstepd.scope/job_4242;reboot/step_0", None, id="bad-characters"),
        pytest.param("/system.slice/slurmstepd.scope/job_-1/step_0", None, id="bad-first-character"),
        pytest.param("/system.slice/slurmstepd.scope/job_" + "9" * 129, None, id="too-long"),
        pytest.param("/slurm/uid_0/job_123+0/step_0", "123+0", id="heterogeneous"),
        pytest.param(f"/docker/{CONTAINER}/slurm/uid_0/job_7/step_0", "7", id="slurm-in-a-container"),
        pytest.param("/slurmstepd.scope/job_8/step_0", "8", id="slurm-v2-in-a-cgroup-namespace"),
    ],
)
def test_slurm_ids_come_only_from_slurms_roots_and_the_outermost_owner_wins(path: str, expected: str | None) -> None:
    assert job_id_from_cgroup_paths([path]) == expected


def test_a_pod_cannot_claim_a_slurm_jobs_cgroup_for_the_host_reader() -> None:
    nested = f"/kubepods/burstable/pod{POD_UID}/{CONTAINER}/slurm/uid_0/job_999/step_0"
    assert job_cgroup(nested, "999") is None  # no Slurm job's cgroup here: its CPU and memory are not the job's
    assert job_cgroup(nested, f"pod/{POD_UID}") == f"/kubepods/burstable/pod{POD_UID}"


def test_kubernetes_in_docker_names_the_pod_not_the_node_container() -> None:
    path = f"/docker/{CONTAINER}/kubepods/besteffort/pod{POD_UID}/{CONTAINER}"
    assert job_id_from_cgroup_paths([path]) == f"pod/{POD_UID}"


def test_plain_process_gets_user_from_uid_and_command_from_comm(proc: Path) -> None:
    write_process(proc, 200, uid=1001, comm="nbody")
    write_process(proc, 201, uid=4321, comm="x" * 80)
    result = mapper(proc).enrich(snapshot(process(200), process(201, 1)))
    assert only(result, 200) == process(200, command="nbody", user="bob", job_id=None)
    unknown = only(result, 201)
    assert unknown.user == "4321"
    assert unknown.command == "x" * 64
    assert [j for j in result.jobs if j.uuid in (UUIDS[0], UUIDS[1])] == []


def test_default_user_lookup_reads_the_passwd_database(proc: Path) -> None:
    write_process(proc, 300, uid=0)
    result = JobMapper(proc_root=proc).enrich(snapshot(process(300)))
    assert only(result, 300).user == pwd.getpwuid(0).pw_name


def test_user_lookups_are_cached(proc: Path) -> None:
    calls: list[int] = []

    def lookup(uid: int) -> str | None:
        calls.append(uid)
        return USERS.get(uid)

    for pid in (10, 11, 12):
        write_process(proc, pid, uid=1000)
    JobMapper(proc_root=proc, user_lookup=lookup).enrich(snapshot(process(10), process(11), process(12, 2)))
    assert calls == [1000]


def test_process_job_becomes_a_gpu_job_with_its_user(proc: Path) -> None:
    write_process(proc, 400, cgroup=SLURM_V1_CGROUP, uid=1000)
    write_process(proc, 401, cgroup=f"0::/system.slice/docker-{CONTAINER}.scope\n", uid=1001)
    result = mapper(proc).enrich(snapshot(process(400, 0), process(401, 2)))
    assert result.jobs == (
        GpuJob(node=NODE, gpu=0, uuid=UUIDS[0], job_id="4242", user="alice"),
        GpuJob(node=NODE, gpu=2, uuid=UUIDS[2], job_id=f"docker/{CONTAINER[:12]}", user="bob"),
    )


def test_fields_the_source_filled_are_kept_and_not_read(proc: Path) -> None:
    filled = process(500, command="sim", user="carol", job_id="9001")
    with opened_files() as opened:
        result = mapper(proc).enrich(snapshot(filled))
    assert only(result, 500) == filled
    assert under(opened, proc) == []
    assert job_keys(result) == [(0, "9001", "carol")]


# --- failures ---------------------------------------------------------------------------------------------------------


def test_vanished_process_is_counted_and_logged_at_debug(proc: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_process(proc, 600)
    caplog.set_level(logging.DEBUG, logger="gpulens.exporter.jobmap")
    result = mapper(proc).enrich(snapshot(process(600), process(601, 1)))
    assert only(result, 601) == process(601, 1)
    assert only(result, 600).user == "alice"
    assert result.errors == {"jobmap_process_gone": 1}
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]


def test_process_exiting_between_reads_is_counted_once(proc: Path) -> None:
    directory = write_process(proc, 610)
    (directory / "status").unlink()
    (directory / "comm").unlink()
    result = mapper(proc).enrich(snapshot(process(610)))
    assert result.errors == {"jobmap_process_gone": 1}
    assert only(result, 610).user is None


def _permission_denied_target() -> Path:
    """A file even root cannot read: sysctl files of mode 0200 refuse reads to everyone, CAP_DAC_OVERRIDE or not.

    chmod 000 does not stop root (the tests run as root in CI), so the fixture's cgroup file is a symlink here.
    """
    target = Path("/proc/sys/vm/drop_caches")
    try:
        target.read_bytes()
    except PermissionError:
        return target
    except OSError:
        pass
    pytest.skip("no file on this system refuses reads with EACCES")


def test_permission_denied_is_counted_and_logged_once(proc: Path, caplog: pytest.LogCaptureFixture) -> None:
    directory = write_process(proc, 700, uid=1001, comm="train")
    (directory / "cgroup").unlink()
    (directory / "cgroup").symlink_to(_permission_denied_target())
    jobs = mapper(proc)
    with caplog.at_level(logging.WARNING, logger="gpulens.exporter.jobmap"):
        jobs.enrich(snapshot(process(700)))
        result = jobs.enrich(snapshot(process(700)))
    assert only(result, 700) == process(700, command="train", user="bob")
    assert result.errors == {"jobmap_permission_denied": 2}
    assert len(caplog.records) == 1
    assert "cgroup" in caplog.records[0].getMessage()


def test_a_directory_where_a_file_should_be_is_a_read_error(proc: Path) -> None:
    directory = write_process(proc, 710)
    (directory / "cgroup").unlink()
    (directory / "cgroup").mkdir()
    result = mapper(proc).enrich(snapshot(process(710)))
    assert only(result, 710) == process(710, command="python3", user="alice")
    assert result.errors == {"jobmap_read_error": 1}


@pytest.mark.parametrize(
    "status",
    [
        pytest.param("Name:\tpython3\nPid:\t720\n", id="no-uid-line"),
        pytest.param("Name:\tpython3\nUid:\tnobody\t0\t0\t0\n", id="uid-not-a-number"),
        pytest.param("Uid:\n", id="uid-empty"),
        pytest.param("", id="empty"),
    ],
)
def test_malformed_status_leaves_the_user_unknown(proc: Path, status: str) -> None:
    write_process(proc, 720, cgroup=SLURM_V1_CGROUP, status=status)
    result = mapper(proc).enrich(snapshot(process(720)))
    assert only(result, 720) == process(720, command="python3", user=None, job_id="4242")
    assert result.errors == {"jobmap_malformed": 1}


def test_malformed_cgroup_lines_are_counted_and_good_lines_still_used(proc: Path) -> None:
    write_process(proc, 730, cgroup="garbage\n0::/system.slice/slurmstepd.scope/job_31/step_0\n")
    write_process(proc, 731, cgroup="")
    result = mapper(proc).enrich(snapshot(process(730), process(731, 1)))
    assert only(result, 730).job_id == "31"
    assert only(result, 731).job_id is None
    assert result.errors == {"jobmap_malformed": 2}


def test_malformed_stat_only_costs_the_cache(proc: Path) -> None:
    directory = write_process(proc, 740, comm="a) b")
    (directory / "stat").write_text("740 (a) b) S 1\n")
    result = mapper(proc).enrich(snapshot(process(740)))
    assert only(result, 740) == process(740, command="a) b", user="alice")
    assert result.errors == {"jobmap_malformed": 1}


def test_start_time_is_read_after_the_last_parenthesis(proc: Path) -> None:
    write_process(proc, 750, comm="a) 1 2 3")
    jobs = mapper(proc)
    jobs.enrich(snapshot(process(750)))
    with opened_files() as opened:
        jobs.enrich(snapshot(process(750)))
    assert under(opened, proc) == ["750/stat"]
    assert jobs.errors == {}


def test_errors_are_cumulative_and_merged_with_the_sources(proc: Path, jobmap: Path) -> None:
    write_process(proc, 800, status="Pid:\t800\n")
    (jobmap / UUIDS[0]).write_text("not a job line at all\n")
    jobs = mapper(proc, jobmap)
    jobs.enrich(snapshot(process(800), process(801)))
    result = jobs.enrich(snapshot(process(800), process(801), errors={"nvml_not_supported": 3}))
    expected = {"jobmap_malformed": 4, "jobmap_process_gone": 2}
    assert dict(jobs.errors) == expected
    assert result.errors == {"nvml_not_supported": 3, **expected}


# --- job-map directory ------------------------------------------------------------------------------------------------


def test_job_map_files_give_jobs_for_gpus_without_processes(proc: Path, jobmap: Path) -> None:
    (jobmap / UUIDS[0]).write_text("4242 1000\n")
    (jobmap / "1").write_text("555\n")
    (jobmap / "7").write_text("999 1000\n")  # no GPU 7 on this node
    result = mapper(proc, jobmap).enrich(snapshot())
    assert job_keys(result) == [(0, "4242", "alice"), (1, "555", None)]
    assert result.errors == {}


def test_uuid_file_wins_over_index_file(proc: Path, jobmap: Path) -> None:
    (jobmap / UUIDS[0]).write_text("100 1000\n")
    (jobmap / "0").write_text("200 1001\n")
    (jobmap / "2").write_text("300 9999\n")
    result = mapper(proc, jobmap).enrich(snapshot())
    assert job_keys(result) == [(0, "100", "alice"), (2, "300", "9999")]


def test_multi_line_file_lists_one_job_per_line(proc: Path, jobmap: Path) -> None:
    (jobmap / "1").write_text("10\n\n11 1001\n10\n")
    write_process(proc, 900)
    result = mapper(proc, jobmap).enrich(snapshot(process(900, 1)))
    assert job_keys(result) == [(1, "10", None), (1, "11", "bob")]
    # Two jobs share the GPU: the process's own job cannot be told, so it inherits none.
    assert only(result, 900).job_id is None


def test_empty_file_means_no_job(proc: Path, jobmap: Path) -> None:
    (jobmap / UUIDS[2]).write_text("")
    (jobmap / "2").write_text("77\n")
    result = mapper(proc, jobmap).enrich(snapshot())
    assert result.jobs == ()
    assert result.errors == {}


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(b"hello world again\n", [], id="three-words"),
        pytest.param(b"12 abc\n", [], id="uid-not-a-number"),
        pytest.param(b"\x00\xff\xfe binary\n", [], id="binary"),
        pytest.param(b"7 1000\n../../etc 1000\nok$ \n8\n", [(0, "7", "alice"), (0, "8", None)], id="mixed"),
    ],
)
def test_garbage_lines_are_counted_and_skipped(
    proc: Path, jobmap: Path, content: bytes, expected: list[tuple[int, str, str | None]]
) -> None:
    (jobmap / UUIDS[0]).write_bytes(content)
    result = mapper(proc, jobmap).enrich(snapshot())
    assert job_keys(result) == expected
    assert result.errors == {"jobmap_malformed": 1}


def test_process_without_cgroup_job_inherits_the_gpus_job(proc: Path, jobmap: Path) -> None:
    (jobmap / UUIDS[0]).write_text("4242 1000\n")
    write_process(proc, 1000)
    write_process(proc, 1001, cgroup="0::/system.slice/slurmstepd.scope/job_4243/step_0\n", uid=1001)
    result = mapper(proc, jobmap).enrich(snapshot(process(1000), process(1001), process(1002)))
    assert only(result, 1000).job_id == "4242"
    assert only(result, 1001).job_id == "4243"
    assert only(result, 1002).job_id == "4242"  # vanished, but on a GPU its job holds
    assert job_keys(result) == [(0, "4242", "alice"), (0, "4243", "bob")]


def test_index_file_matches_gpus_seen_only_through_processes(proc: Path, jobmap: Path) -> None:
    (jobmap / "1").write_text("61\n")
    write_process(proc, 1100)
    bare = NodeSnapshot(node=NODE, timestamp=0.0, source="nvml", processes=(process(1100, 1),))
    result = mapper(proc, jobmap).enrich(bare)
    assert only(result, 1100).job_id == "61"
    assert result.jobs == (GpuJob(node=NODE, gpu=1, uuid=UUIDS[1], job_id="61", user="alice"),)


@pytest.mark.parametrize("kind", ["missing", "a-file"])
def test_unreadable_job_map_dir_is_counted(proc: Path, tmp_path: Path, kind: str) -> None:
    directory = tmp_path / "gpustat"
    if kind == "a-file":
        directory.write_text("4242\n")
    write_process(proc, 1200, cgroup=SLURM_V1_CGROUP)
    result = mapper(proc, directory).enrich(snapshot(process(1200)))
    assert only(result, 1200).job_id == "4242"
    assert job_keys(result) == [(0, "4242", "alice")]
    assert result.errors == {"jobmap_dir_unreadable": 1}


def test_fifo_in_job_map_dir_is_refused_without_blocking(proc: Path, jobmap: Path) -> None:
    fifo = jobmap / UUIDS[0]
    os.mkfifo(fifo)
    # Holding the FIFO open for writing, with data in it, means no open() or read() of it can block, so even a
    # regression cannot hang this test: it would read the job instead.
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        os.write(writer, b"31 1000\n")
        result = mapper(proc, jobmap).enrich(snapshot())
    finally:
        os.close(writer)
    assert result.jobs == ()
    assert result.errors == {"jobmap_read_error": 1}


def test_existing_jobs_are_kept_and_deduplicated(proc: Path, jobmap: Path) -> None:
    existing = (
        GpuJob(node=NODE, gpu=2, uuid=UUIDS[2], job_id="sim-1", user="dave"),
        GpuJob(node=NODE, gpu=0, uuid=UUIDS[0], job_id="4242"),
    )
    (jobmap / UUIDS[0]).write_text("4242 1000\n")
    write_process(proc, 1300, cgroup=SLURM_V1_CGROUP)
    result = mapper(proc, jobmap).enrich(snapshot(process(1300), jobs=existing))
    assert job_keys(result) == [(0, "4242", "alice"), (2, "sim-1", "dave")]


def test_output_is_deterministic(proc: Path, jobmap: Path) -> None:
    (jobmap / UUIDS[1]).write_text("20 1001\n21\n")
    (jobmap / "2").write_text("30\n")
    write_process(proc, 1400, cgroup=SLURM_V1_CGROUP)
    write_process(proc, 1401, cgroup=f"0::/kubepods/pod{POD_UID}/{CONTAINER}\n", uid=1001)
    write_process(proc, 1402, cgroup=f"0::/system.slice/docker-{CONTAINER}.scope\n")
    readings = [process(1402, 2), process(1400, 0), process(1401, 1), process(1400, 1)]
    existing = (GpuJob(node=NODE, gpu=2, uuid=UUIDS[2], job_id="30", user="erin"),)
    forward = mapper(proc, jobmap).enrich(snapshot(*readings, jobs=existing))
    backward = mapper(proc, jobmap).enrich(snapshot(*reversed(readings), jobs=existing))
    assert forward.jobs == backward.jobs
    assert [(j.gpu, j.job_id) for j in forward.jobs] == sorted((j.gpu, j.job_id) for j in forward.jobs)
    assert job_keys(forward) == [
        (0, "4242", "alice"),
        (1, "20", "bob"),
        (1, "21", None),
        (1, "4242", "alice"),
        (1, f"pod/{POD_UID}", "bob"),
        (2, "30", "erin"),
        (2, f"docker/{CONTAINER[:12]}", "alice"),
    ]
    assert [p.pid for p in forward.processes] == [1402, 1400, 1401, 1400]


# --- secrets, caching, the real /proc ---------------------------------------------------------------------------------


def test_environment_and_command_line_are_never_read(
    proc: Path, jobmap: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Two independent proofs. Every fixture process has SECRET in its environ and cmdline files: it must appear
    # nowhere in the output or the log. And the audit hook shows which files were opened at all: only the four that
    # hold no secrets, so a regression that read environ but dropped the value would still fail here.
    (jobmap / UUIDS[1]).write_text("4242 1000\n")
    write_process(proc, 1500, cgroup=SLURM_V1_CGROUP)
    write_process(proc, 1501, status="garbage\n", comm=f"x{SECRET}"[:15])
    write_process(proc, 1502, cgroup=f"0::/kubepods/pod{POD_UID}/{CONTAINER}\n")
    readings = snapshot(process(1500), process(1501, 1), process(1502, 2), process(1503))
    caplog.set_level(logging.DEBUG)
    with opened_files() as opened:
        result = mapper(proc, jobmap).enrich(readings)
    document = json.dumps(snapshot_to_json(result))
    assert json.loads(document)["processes"][0]["job_id"] == "4242"
    assert SECRET not in document
    assert SECRET not in repr(result)
    assert SECRET not in caplog.text
    read = under(opened, proc)
    assert {Path(p).name for p in read} == {"stat", "cgroup", "status", "comm"}
    assert not [p for p in read if Path(p).name in ("environ", "cmdline")]


def test_unchanged_process_costs_one_stat_read(proc: Path) -> None:
    write_process(proc, 1600, cgroup=SLURM_V1_CGROUP)
    jobs = mapper(proc)
    first = jobs.enrich(snapshot(process(1600), process(1600, 1)))
    with opened_files() as opened:
        second = jobs.enrich(snapshot(process(1600), process(1600, 1)))
    assert under(opened, proc) == ["1600/stat"]
    assert second.processes == first.processes


def test_process_on_two_gpus_is_read_once(proc: Path) -> None:
    write_process(proc, 1650)
    with opened_files() as opened:
        result = mapper(proc).enrich(snapshot(process(1650), process(1650, 1)))
    assert under(opened, proc) == ["1650/cgroup", "1650/comm", "1650/stat", "1650/status"]
    assert {p.user for p in result.processes} == {"alice"}


def test_reused_pid_is_read_again(proc: Path) -> None:
    write_process(proc, 1700, comm="old", start_time=100)
    jobs = mapper(proc)
    jobs.enrich(snapshot(process(1700)))
    (proc / "1700").rename(proc / "gone")
    write_process(proc, 1700, comm="new", uid=1001, start_time=200)
    result = jobs.enrich(snapshot(process(1700)))
    assert only(result, 1700) == process(1700, command="new", user="bob")


def test_pids_that_leave_the_snapshot_are_evicted(proc: Path) -> None:
    write_process(proc, 1800)
    jobs = mapper(proc)
    jobs.enrich(snapshot(process(1800)))
    jobs.enrich(snapshot())
    with opened_files() as opened:
        jobs.enrich(snapshot(process(1800)))
    assert "1800/cgroup" in under(opened, proc)


def test_failed_reads_are_not_cached(proc: Path) -> None:
    write_process(proc, 1900, status="Pid:\t1900\n")
    jobs = mapper(proc)
    jobs.enrich(snapshot(process(1900)))
    (proc / "1900" / "status").write_text("Uid:\t1000\t1000\t1000\t1000\n")
    result = jobs.enrich(snapshot(process(1900)))
    assert only(result, 1900).user == "alice"
    assert jobs.errors == {"jobmap_malformed": 1}


def test_reads_the_real_proc_for_this_process() -> None:
    pid = os.getpid()
    result = JobMapper().enrich(snapshot(process(pid)))
    mine = only(result, pid)
    assert mine.user == pwd.getpwuid(os.getuid()).pw_name
    assert mine.command
    assert len(mine.command) <= 15
    assert result.errors == {}


def test_a_gpu_in_the_job_map_holds_its_jobs_whatever_the_source_says(jobmap: Path) -> None:
    """The simulator's case: no /proc is read; the job map overrides the source's jobs and processes GPU by GPU."""
    (jobmap / UUIDS[0]).write_text("77 1000\n")
    existing = (
        GpuJob(node=NODE, gpu=0, uuid=UUIDS[0], job_id="sim-1", user="dave"),
        GpuJob(node=NODE, gpu=1, uuid=UUIDS[1], job_id="sim-1", user="dave"),
    )
    readings = [dataclasses.replace(process(1, 0), job_id="sim-1"), dataclasses.replace(process(2, 1), job_id="sim-1")]
    result = JobMapper(job_map_dir=jobmap, inspect_processes=False, user_lookup=USERS.get).enrich(
        snapshot(*readings, jobs=existing)
    )
    assert job_keys(result) == [(0, "77", "alice"), (1, "sim-1", "dave")]
    assert [(p.gpu, p.job_id) for p in result.processes] == [(0, "77"), (1, "sim-1")]


def test_a_job_the_prolog_named_by_uuid_is_not_read_from_index_files(jobmap: Path) -> None:
    """Slurm's GPU 0 is the source's GPU 1: the prolog wrote both "0" and GPU 1's UUID; only the UUID counts."""
    (jobmap / "0").write_text("88 1000\n")
    (jobmap / UUIDS[1]).write_text("88 1000\n")
    (jobmap / "2").write_text("99 1000\n")  # a job mapped by index only (no nvidia-smi) still is
    gpus = tuple(GpuReading(node=NODE, gpu=i, uuid=UUIDS[i], model="m", timestamp=0.0) for i in range(3))
    result = JobMapper(job_map_dir=jobmap, inspect_processes=False, user_lookup=USERS.get).enrich(
        NodeSnapshot(node=NODE, timestamp=0.0, source="sim", gpus=gpus)
    )
    assert [(j.gpu, j.job_id) for j in result.jobs] == [(1, "88"), (2, "99")]
