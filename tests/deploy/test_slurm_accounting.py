"""deploy/slurm/epilog-slurmctld.sh: the real `gpulens job-summary` over a real store, into a recording scontrol."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpulens.model import GpuJob, NodeSnapshot
from gpulens.storage.db import Database
from gpulens.storage.writer import Writer
from tests.conftest import require_tool
from tests.deploy.support import DEPLOY
from tests.fakes.static_source import h100

SCRIPT = DEPLOY / "slurm" / "epilog-slurmctld.sh"
T0 = 1_767_225_600.0
RECORDING_SCONTROL = """#!/bin/sh
printf '%s\\n' "$@" > "$(dirname "$0")/scontrol.args"
"""


def test_the_script_is_shellcheck_clean() -> None:
    result = subprocess.run(
        [require_tool("shellcheck"), "--shell=bash", str(SCRIPT)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A store where job 4242 held two GPUs for 60 s, a gpulens.toml naming it, and a scontrol that records."""
    url = f"sqlite:///{tmp_path / 'gpulens.db'}"
    db = Database(url)
    db.upgrade()
    writer = Writer(db)
    for k in range(8):
        t = T0 + 10 * k
        gpus = tuple(h100("gpu-07", i, t) for i in range(2))
        jobs = tuple(GpuJob("gpu-07", g.gpu, g.uuid, "4242", "alice") for g in gpus) if k < 7 else ()
        writer.write([NodeSnapshot("gpu-07", t, "test", gpus=gpus, jobs=jobs)])
    db.close()
    (tmp_path / "gpulens.toml").write_text(f'[database]\nurl = "{url}"\n\n[accounting]\nprice_per_gpu_hour = 3.0\n')
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(RECORDING_SCONTROL)
    scontrol.chmod(0o755)
    return tmp_path


def run(site: Path, job: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": f"{site / 'bin'}:{os.defpath}",
        "SLURM_JOB_ID": job,
        "GPULENS_CONFIG": str(site / "gpulens.toml"),
        "GPULENS": str(Path(sys.executable).parent / "gpulens"),
    }
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120, check=False)


def test_the_summary_lands_in_the_jobs_admin_comment(site: Path) -> None:
    result = run(site, "4242")
    assert result.returncode == 0, result.stderr
    update, job, comment = (site / "bin" / "scontrol.args").read_text().splitlines()
    assert (update, job) == ("update", "JobId=4242")
    assert comment.startswith("AdminComment={")
    summary = json.loads(comment.removeprefix("AdminComment="))
    assert (summary["job_id"], summary["user"], summary["gpus"], summary["ended"]) == ("4242", "alice", 2, True)
    assert summary["gpu_hours"] == pytest.approx(2 * 60 / 3600)
    assert summary["cost"] == pytest.approx(2 * 60 / 3600 * 3.0)


def test_a_job_gpulens_never_saw_gets_no_comment_and_the_script_exits_zero(site: Path) -> None:
    result = run(site, "777")
    assert result.returncode == 0
    assert "job 777: no summary: gpulens job-summary: no job '777'" in result.stderr
    assert not (site / "bin" / "scontrol.args").exists()
    bad = run(site, "7; rm -rf /")
    assert bad.returncode == 0
    assert "not a job id" in bad.stderr
