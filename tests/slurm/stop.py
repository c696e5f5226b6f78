"""Stopping the tests' one-node Slurm (deploy/slurm/testing/start-slurm.sh) when the test session ends: the daemons
named by the pid files in its directory (slurmd, slurmctld and its own munged), each sent SIGTERM and waited for
(then SIGKILL), so that nothing of a test run keeps running after ``make test`` or holds Slurm's ports on a machine
that is itself a Slurm node."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

DEFAULT_DIR = "/tmp/gpulens-test-slurm"
PIDFILES = ("slurmd.pid", "slurmctld.pid", "munge/munged.pid")  # the node, its controller, then their munged


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def slurm_dir() -> Path:
    """The test Slurm's folder: ``GPULENS_TEST_SLURM_DIR``, or /tmp/gpulens-test-slurm."""
    return Path(os.environ.get("GPULENS_TEST_SLURM_DIR", DEFAULT_DIR))


def stop_test_slurm(directory: Path | None = None, wait_s: float = 10.0) -> list[int]:
    """Stop the daemons started from ``directory`` (``slurm_dir()`` by default); return their pids."""
    root = directory or slurm_dir()
    stopped = []
    for name in PIDFILES:
        try:
            pid = int((root / name).read_text().strip())
        except (OSError, ValueError):
            continue
        if pid <= 1 or not _alive(pid):
            continue
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + wait_s
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
        stopped.append(pid)
    return stopped
