"""Fixture trees for the fabric readers: a sysfs root and /proc + cgroup roots laid out like real machines.

``tests/fixtures/sysfs`` is one node: mlx5_0..mlx5_7 (ConnectX-7, NDR InfiniBand), each under its own PCIe switch
beside one H100 (GPU i at 0000:{18,38,58,78,98,b8,d8,f8}:00.0), GPUs 0-3 and mlx5_0-3 on NUMA node 0, the rest on
node 1; mlx5_8, a RoCE (Ethernet) port with hw_counters behind its own root port on NUMA node 1; mlx5_9, an NDR port
with no cable (DOWN/Polling) behind its own root port on NUMA node 0.

``tests/fixtures/proc/v2`` is a cgroup v2 node (``proc/`` and ``cgroup/``): Slurm jobs 4242-4248 (pids 4101-4107,
plus pid 4120 in job 4242's second step), a Kubernetes pod (pid 5201) and sshd (pid 812, in no job);
``proc/stat-later`` is its ``/proc/stat`` a little later. ``tests/fixtures/proc/v1`` is a cgroup v1 node with
Slurm jobs 777 (pid 7001) and 778 (pid 7002).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
SYSFS = FIXTURES / "sysfs"
PROC = FIXTURES / "proc"
V2_PROC = PROC / "v2" / "proc"
V2_CGROUP = PROC / "v2" / "cgroup"
V1_PROC = PROC / "v1" / "proc"
V1_CGROUP = PROC / "v1" / "cgroup"
STAT_LATER = PROC / "stat-later"
# GPU index -> PCI address as NVML spells it
GPU_BUS_IDS = {i: f"00000000:{bus:02X}:00.0" for i, bus in enumerate((0x18, 0x38, 0x58, 0x78, 0x98, 0xB8, 0xD8, 0xF8))}


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    """A private copy of the sysfs tree (symlinks kept) that a test may damage."""
    root = tmp_path / "root"
    shutil.copytree(SYSFS, root, symlinks=True)
    return root


@pytest.fixture
def proc_v2(tmp_path: Path) -> Path:
    """A private copy of the cgroup v2 node: ``<copy>/proc`` and ``<copy>/cgroup``."""
    root = tmp_path / "v2"
    shutil.copytree(PROC / "v2", root, symlinks=True)
    return root


def port_dir(root: Path, device: str, port: int = 1) -> Path:
    return root / "sys" / "class" / "infiniband" / device / "ports" / str(port)
