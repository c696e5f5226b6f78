"""The Slurm prolog and epilog, run by bash as slurmd runs them with a fake nvidia-smi, then read by the exporter."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpulens.exporter.jobmap import JobMapper
from gpulens.model import GpuJob, GpuReading, NodeSnapshot
from tests.conftest import require_tool
from tests.deploy.support import DEPLOY

PROLOG = DEPLOY / "slurm" / "prolog.sh"
EPILOG = DEPLOY / "slurm" / "epilog.sh"
UUIDS = {
    0: "GPU-0b1c2d3e-0000-4000-8000-000000000000",
    1: "GPU-1b1c2d3e-0000-4000-8000-000000000001",
    2: "GPU-2b1c2d3e-0000-4000-8000-000000000002",
    3: "GPU-3b1c2d3e-0000-4000-8000-000000000003",
}

# nvidia-smi as the prolog calls it: anything else is an error, so a changed query fails the tests.
FAKE_NVIDIA_SMI = """#!/bin/sh
if [ "$*" != "--query-gpu=index,uuid --format=csv,noheader" ]; then
  echo "fake nvidia-smi: unexpected arguments: $*" >&2
  exit 2
fi
cat "$(dirname "$0")/gpus.csv"
"""


@pytest.fixture
def fake_bin(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_NVIDIA_SMI)
    smi.chmod(0o755)
    (bin_dir / "gpus.csv").write_text("".join(f"{i}, {uuid}\n" for i, uuid in UUIDS.items()))
    return bin_dir


@pytest.fixture
def gpustat(tmp_path: Path) -> Path:
    return tmp_path / "run" / "gpustat"


def run(script: Path, gpustat: Path, fake_bin: Path, **slurm: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{fake_bin}:{os.defpath}", "GPUSTAT_DIR": str(gpustat), **slurm}
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60, check=False)


def files(gpustat: Path) -> dict[str, list[str]]:
    """The job-map files (not the lock) and their lines."""
    return {p.name: p.read_text().splitlines() for p in sorted(gpustat.iterdir()) if not p.name.startswith(".")}


def test_scripts_are_shellcheck_clean() -> None:
    shellcheck = require_tool("shellcheck")
    result = subprocess.run(
        [shellcheck, "--shell=bash", str(PROLOG), str(EPILOG), str(DEPLOY / "make-secrets.sh")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout


def test_prolog_maps_each_gpu_by_uuid_and_index_and_epilog_removes_them(gpustat: Path, fake_bin: Path) -> None:
    prolog = run(PROLOG, gpustat, fake_bin, SLURM_JOB_ID="4242", SLURM_JOB_UID="1000", SLURM_JOB_GPUS="0,2")
    assert prolog.returncode == 0, prolog.stderr
    assert prolog.stderr == ""
    line = ["4242 1000"]
    assert files(gpustat) == {"0": line, "2": line, UUIDS[0]: line, UUIDS[2]: line}
    assert all(oct(p.stat().st_mode & 0o777) == "0o644" for p in gpustat.iterdir() if not p.name.startswith("."))
    epilog = run(EPILOG, gpustat, fake_bin, SLURM_JOB_ID="4242")
    assert epilog.returncode == 0, epilog.stderr
    assert files(gpustat) == {}


def test_gpus_from_cuda_visible_devices_ranges_and_uuids(gpustat: Path, fake_bin: Path) -> None:
    run(PROLOG, gpustat, fake_bin, SLURM_JOB_ID="7", SLURM_JOB_UID="1", CUDA_VISIBLE_DEVICES="1-2")
    run(PROLOG, gpustat, fake_bin, SLURM_JOB_ID="8", SLURM_JOB_UID="2", GPU_DEVICE_ORDINAL=UUIDS[3])
    assert files(gpustat) == {
        "1": ["7 1"],
        "2": ["7 1"],
        UUIDS[1]: ["7 1"],
        UUIDS[2]: ["7 1"],
        UUIDS[3]: ["8 2"],
    }


def test_jobs_sharing_a_gpu_each_keep_their_line(gpustat: Path, fake_bin: Path) -> None:
    run(PROLOG, gpustat, fake_bin, SLURM_JOB_ID="100", SLURM_JOB_UID="1000", SLURM_JOB_GPUS="1")
    run(PROLOG, gpustat, fake_bin, SLURM_JOB_ID="101_3", SLURM_JOB_UID="1001", SLURM_JOB_GPUS="1")
    run(PROLOG, gpustat, fake_bin, SLURM_JOB_ID="100", SLURM_JOB_UID="1000", SLURM_JOB_GPUS="1")  # requeued
    assert files(gpustat)[UUIDS[1]] == ["101_3 1001", "100 1000"]
    run(EPILOG, gpustat, fake_bin, SLURM_JOB_ID="100")
    assert files(gpustat) == {"1": ["101_3 1001"], UUIDS[1]: ["101_3 1001"]}
    run(EPILOG, gpustat, fake_bin, SLURM_JOB_ID="101_3")
    assert files(gpustat) == {}


def enrich(gpustat: Path, tmp_path: Path) -> NodeSnapshot:
    """What the exporter makes of the job-map directory for a node with the fake nvidia-smi's four GPUs."""
    gpus = tuple(GpuReading(node="gpu-07", gpu=i, uuid=uuid, model="H100", timestamp=1.0) for i, uuid in UUIDS.items())
    proc = tmp_path / "proc"
    proc.mkdir(exist_ok=True)
    mapper = JobMapper(proc_root=proc, job_map_dir=gpustat, user_lookup=lambda uid: f"user{uid}")
    snapshot = mapper.enrich(NodeSnapshot(node="gpu-07", timestamp=1.0, source="test", gpus=gpus))
    assert not mapper.errors
    return snapshot


def test_the_exporter_reads_what_the_prolog_writes(gpustat: Path, fake_bin: Path, tmp_path: Path) -> None:
    run(PROLOG, gpustat, fake_bin, SLURM_JOB_ID="4242", SLURM_JOB_UID="1000", SLURM_JOB_GPUS="1,3")
    for index_file in ("1", "3"):
        (gpustat / index_file).unlink()  # the UUID files alone suffice
    assert set(enrich(gpustat, tmp_path).jobs) == {
        GpuJob(node="gpu-07", gpu=1, uuid=UUIDS[1], job_id="4242", user="user1000"),
        GpuJob(node="gpu-07", gpu=3, uuid=UUIDS[3], job_id="4242", user="user1000"),
    }
    run(EPILOG, gpustat, fake_bin, SLURM_JOB_ID="4242")
    assert enrich(gpustat, tmp_path).jobs == ()


def test_prolog_falls_back_to_index_files_when_nvidia_smi_fails(gpustat: Path, fake_bin: Path, tmp_path: Path) -> None:
    (fake_bin / "gpus.csv").unlink()  # the fake's `cat` fails
    result = run(PROLOG, gpustat, fake_bin, SLURM_JOB_ID="9", SLURM_JOB_UID="5", SLURM_JOB_GPUS="3")
    assert result.returncode == 0
    assert "nvidia-smi failed" in result.stderr
    assert files(gpustat) == {"3": ["9 5"]}
    assert enrich(gpustat, tmp_path).jobs == (GpuJob(node="gpu-07", gpu=3, uuid=UUIDS[3], job_id="9", user="user5"),)


@pytest.mark.parametrize(
    "slurm",
    [
        {"SLURM_JOB_ID": "1", "SLURM_JOB_UID": "0"},  # no GPUs
        {"SLURM_JOB_ID": "1", "SLURM_JOB_UID": "0", "SLURM_JOB_GPUS": "NoDevFiles"},
        {"SLURM_JOB_ID": "1; rm -rf /", "SLURM_JOB_UID": "0", "SLURM_JOB_GPUS": "0"},
        {"SLURM_JOB_ID": "../../etc", "SLURM_JOB_UID": "0", "SLURM_JOB_GPUS": "0"},
        {"SLURM_JOB_ID": "1", "SLURM_JOB_UID": "root", "SLURM_JOB_GPUS": "0"},
        {"SLURM_JOB_GPUS": "0"},
    ],
    ids=["no-gpus", "no-dev-files", "injected-id", "path-id", "bad-uid", "no-job"],
)
def test_prolog_writes_nothing_for_jobs_it_cannot_map_and_never_fails(
    gpustat: Path, fake_bin: Path, slurm: dict[str, str]
) -> None:
    result = run(PROLOG, gpustat, fake_bin, **slurm)
    assert result.returncode == 0, result.stderr
    assert not gpustat.exists()


def test_prolog_skips_unknown_gpu_names(gpustat: Path, fake_bin: Path) -> None:
    result = run(PROLOG, gpustat, fake_bin, SLURM_JOB_ID="5", SLURM_JOB_UID="5", SLURM_JOB_GPUS="0,../x,MIG-1")
    assert result.returncode == 0
    assert "'../x'" in result.stderr
    assert files(gpustat) == {"0": ["5 5"], UUIDS[0]: ["5 5"]}


def test_prolog_exits_zero_even_when_it_cannot_write(gpustat: Path, fake_bin: Path) -> None:
    gpustat.parent.mkdir(parents=True)
    gpustat.write_text("not a directory")
    result = run(PROLOG, gpustat, fake_bin, SLURM_JOB_ID="5", SLURM_JOB_UID="5", SLURM_JOB_GPUS="0")
    assert result.returncode == 0  # a failing prolog would drain the node
    assert "unexpected failure" in result.stderr


def test_epilog_leaves_other_jobs_and_tolerates_a_missing_directory(gpustat: Path, fake_bin: Path) -> None:
    missing = run(EPILOG, gpustat, fake_bin, SLURM_JOB_ID="1")
    assert missing.returncode == 0
    run(PROLOG, gpustat, fake_bin, SLURM_JOB_ID="1", SLURM_JOB_UID="0", SLURM_JOB_GPUS="0")
    run(PROLOG, gpustat, fake_bin, SLURM_JOB_ID="2", SLURM_JOB_UID="0", SLURM_JOB_GPUS="1")
    run(EPILOG, gpustat, fake_bin, SLURM_JOB_ID="1")
    assert files(gpustat) == {"1": ["2 0"], UUIDS[1]: ["2 0"]}
    bad = run(EPILOG, gpustat, fake_bin, SLURM_JOB_ID="")
    assert bad.returncode == 0
    assert files(gpustat) == {"1": ["2 0"], UUIDS[1]: ["2 0"]}
