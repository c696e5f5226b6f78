"""A real one-node Slurm (deploy/slurm/testing/start-slurm.sh), started once per session and reused by every test.

The scheduler, munge, the prolog and the epilog are real; the GPUs are stand-in devices. A missing Slurm fails the
tests (it never skips them): .ci/run installs it. Each test cancels the jobs it submitted and waits until the
epilog has cleaned the job map and the node is idle again, so tests stay independent.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.slurm.stop import slurm_dir

REPO = Path(__file__).resolve().parents[2]
START = REPO / "deploy" / "slurm" / "testing" / "start-slurm.sh"
TOOLS = ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "munged")
POLL_S = 0.05
MAX_POLLS = 1200  # at most a minute of polling for one condition


def wait_for(condition: Callable[[], object], what: str, polls: int = MAX_POLLS) -> None:
    """Poll ``condition`` until it is true; fail naming ``what`` after ``polls`` tries."""
    for _ in range(polls):
        if condition():
            return
        time.sleep(POLL_S)
    pytest.fail(f"timed out waiting for {what} (last: {condition()!r})")


def gpu_indices(text: str) -> set[int]:
    """Slurm's GPU index list ``0-1,4`` as a set."""
    found: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        found.update(range(int(low), int(high or low) + 1))
    return found


@dataclass
class Slurm:
    dir: Path
    host: str
    submitted: list[str] = field(default_factory=list)

    @property
    def gpustat(self) -> Path:
        return self.dir / "gpustat"

    def run(self, *argv: str) -> str:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            pytest.fail(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def sbatch(self, *args: str) -> str:
        """Submit a batch job that sleeps until cancelled; its job id (the array's id for --array)."""
        out = self.run("sbatch", "--parsable", "--chdir=/tmp", "--output=/dev/null", *args, "--wrap", "sleep 600")
        job = out.strip().split(";")[0]
        self.submitted.append(job)
        return job

    def state(self, job: str) -> str:
        """The job's state (RUNNING, PENDING, ...), "" once Slurm no longer lists it; "MIXED" for an array whose
        tasks differ."""
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=60)
        states = set(out.stdout.split())
        return states.pop() if len(states) == 1 else "MIXED" if states else ""

    def allocated_gpus(self, job: str) -> set[int]:
        """The GPU indices Slurm gave the job (``scontrol show job -d``: ``GRES=gpu:2(IDX:0-1)``)."""
        match = re.search(r"GRES=gpu[^(\s]*\(IDX:([0-9,-]+)\)", self.run("scontrol", "show", "job", "-d", job))
        assert match is not None, f"job {job} has no GPUs in scontrol show job -d"
        return gpu_indices(match.group(1))

    def array_tasks(self, array_job: str) -> dict[int, str]:
        """Array task id -> the task's own job id (SLURM_JOB_ID in its prolog)."""
        out = self.run("squeue", "-h", "-r", "-j", array_job, "-o", "%K %A")
        return {int(task): job for task, job in (line.split() for line in out.splitlines()) if task.isdigit()}

    def node_state(self) -> str:
        """The node's state as scontrol says it, lower case: "idle", "mixed", "idle+drain", ... ("sinfo -n" can lag)."""
        match = re.search(r"\bState=(\S+)", self.run("scontrol", "show", "node", self.host))
        assert match is not None
        return match.group(1).lower()

    def node_reason(self) -> str:
        """The reason the node is drained, without the "[user@time]" scontrol adds."""
        match = re.search(r"\bReason=(.*?) \[[^]]*\]\s*$", self.run("scontrol", "show", "node", self.host), re.M)
        return match.group(1) if match else ""

    def set_uuids(self, uuids: list[str]) -> None:
        """Make the stand-in nvidia-smi name Slurm's GPU i with ``uuids[i]`` (the prolog's UUID path)."""
        (self.dir / "uuids").write_text("".join(u + "\n" for u in uuids))

    def clean_up(self) -> None:
        """Cancel this test's jobs, forget the stand-in UUIDs, resume the node; wait until the node is idle."""
        if self.submitted:
            subprocess.run(["scancel", *self.submitted], capture_output=True, timeout=60, check=False)
            for job in self.submitted:
                wait_for(lambda job=job: self.state(job) in ("", "COMPLETED", "CANCELLED"), f"job {job} to end")
            self.submitted.clear()
        (self.dir / "uuids").unlink(missing_ok=True)
        if "drain" in self.node_state():
            self.run("scontrol", "update", f"NodeName={self.host}", "State=RESUME")
        wait_for(lambda: not [p for p in self.gpustat.iterdir() if not p.name.startswith(".")], "the epilog")
        # "idle+not_responding": idle, and not yet answered slurmctld's next ping (after the machine was paused)
        wait_for(lambda: self.node_state().split("+")[0] == "idle" and "drain" not in self.node_state(), "idle")


@pytest.fixture(scope="session")
def slurm_session() -> Iterator[Path]:
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.fail(
            f"Slurm is not installed ({', '.join(missing)} missing): run .ci/run (apt-get install slurmctld "
            "slurmd slurm-client munge) before the tests"
        )
    directory = slurm_dir()
    # Private ports, never Slurm's own 6817 and 6818: a machine that is a Slurm node keeps its daemons to itself.
    ports = {"SLURM_TEST_CTLD_PORT": str(free_port()), "SLURM_TEST_SLURMD_PORT": str(free_port())}
    done = subprocess.run(
        [str(START), str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **ports},
    )
    if done.returncode != 0:
        pytest.fail(f"start-slurm.sh failed: {done.stderr.strip() or done.stdout.strip()}")
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(directory / "slurm.conf")  # squeue, sbatch and the exporter's squeue find it
    try:
        yield directory
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous


@pytest.fixture
def slurm(slurm_session: Path) -> Iterator[Slurm]:
    """The session's Slurm, idle; whatever the test submitted is cancelled afterwards."""
    cluster = Slurm(
        dir=slurm_session,
        host=subprocess.run(["hostname", "-s"], capture_output=True, text=True, check=True).stdout.strip(),
    )
    cluster.clean_up()
    try:
        yield cluster
    finally:
        cluster.clean_up()
