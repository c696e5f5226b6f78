"""Fabric and host readers on the fixture trees: the cost of one full read of 8 NICs + host + 8 jobs.

One read is: every RDMA port (8 ConnectX-7 NDR ports, the fixture's RoCE and down ports removed), their GPU
affinity (cached after the first read, as in the agent), the node's /proc/stat and /proc/meminfo, and 8 jobs' cgroup
v2 files found from 8 pids. The fixture is ordinary files in the page cache: on a real node each ``counters/`` and
``hw_counters/`` read is a query to the HCA's firmware and costs more (see docs/fabric.md).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

from exporter.fabric.affinity import PciTopology
from exporter.fabric.host import HostReader, JobHostReader
from exporter.fabric.ibports import IbPortReader
from tests.exporter.fabric.conftest import GPU_BUS_IDS, SYSFS, V2_CGROUP, V2_PROC

READS = 1000
JOB_PIDS = (*range(4101, 4108), 5201)  # Slurm jobs 4242-4248 and one Kubernetes pod


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "sysfs"
        shutil.copytree(SYSFS, root, symlinks=True)
        for extra in ("mlx5_8", "mlx5_9"):
            (root / "sys" / "class" / "infiniband" / extra).unlink()
        ports = IbPortReader("bench", root=str(root))
        topology = PciTopology(root=str(root))
        host = HostReader("bench", proc_root=str(V2_PROC))
        jobs = JobHostReader("bench", proc_root=str(V2_PROC), cgroup_root=str(V2_CGROUP))

        def read_all() -> tuple[int, int]:
            nics = topology.assign(ports.read(), GPU_BUS_IDS)
            host.read()
            return len(nics), len(jobs.read(JOB_PIDS))

        assert read_all() == (8, 8)
        parts = {
            "ports": lambda: ports.read(),
            "ports_and_affinity": lambda: topology.assign(ports.read(), GPU_BUS_IDS),
            "host": lambda: host.read(),
            "jobs": lambda: jobs.read(JOB_PIDS),
        }
        start, cpu_start = time.perf_counter(), time.process_time()
        for _ in range(READS):
            read_all()
        total, cpu = (time.perf_counter() - start) / READS, (time.process_time() - cpu_start) / READS
        print(f"fabric_full_read_8nics_host_8jobs: {total * 1e6:.0f} us")
        print(f"fabric_full_read_8nics_host_8jobs_cpu: {cpu * 1e6:.0f} us")
        for name, call in parts.items():
            start = time.perf_counter()
            for _ in range(READS):
                call()
            print(f"fabric_{name}_read: {(time.perf_counter() - start) / READS * 1e6:.0f} us")
        errors = {**ports.errors, **topology.errors, **host.errors, **jobs.errors}
        assert not errors, errors
    return 0


if __name__ == "__main__":
    sys.exit(main())
