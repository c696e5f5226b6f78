"""Fabric and host reading: the readers' cost on the fixture trees, and what they add to the exporter's collection.

Part 1, the readers alone: one read is every RDMA port (8 ConnectX-7 NDR ports, the fixture's RoCE and down ports
removed), their GPU affinity (cached after the first read, as in the agent), the node's /proc/stat and
/proc/meminfo, and 8 jobs' cgroup v2 files found from 8 pids.

Part 2, the exporter: one Poller collection (fake NVML, 8 H100s with realistic call latencies as in
bench_exporter, the job mapping, rendering /metrics and gzipping it) with and without the fabric reader
(``FabricReader``: 8 NICs, the host and the 8 jobs' cgroups), alternating in the same run. Printed: the CPU time of one
collection each way (median ``time.process_time``, every thread of the process) and their difference; and, measured
directly, the fabric's added CPU per collection: the reader's own CPU inside the collection (``time.thread_time``
around ``FabricReader.enrich``) plus the added rendering of /metrics and its gzip for the fabric families; that sum
as a share of one core at a 1 s interval. The direct figure is the one to trust on a loaded machine: the difference
of two medians of whole-process CPU is noisy.

The fixture is ordinary files in the page cache: on a real node each ``counters/`` and ``hw_counters/`` read is a
query to the HCA's firmware and costs more (see docs/fabric.md).
"""

from __future__ import annotations

import gzip
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench import options
from gpulens.clock import SystemClock
from gpulens.exporter.fabric.affinity import PciTopology
from gpulens.exporter.fabric.host import HostReader, JobHostReader
from gpulens.exporter.fabric.ibports import IbPortReader
from gpulens.exporter.fabric.node import FabricReader
from gpulens.exporter.jobmap import JobMapper
from gpulens.exporter.metrics import ExporterHealth, render_metrics
from gpulens.exporter.nvml import NvmlSource
from gpulens.exporter.poller import Enricher, Poller
from gpulens.model import NodeSnapshot
from tests.exporter.fabric.conftest import GPU_BUS_IDS, SYSFS, V2_CGROUP, V2_PROC
from tests.fakes.fake_nvml import FakeNvml

READS = 1000
JOB_PIDS = (*range(4101, 4108), 5201)  # Slurm jobs 4242-4248 and one Kubernetes pod
CALL_LATENCY_S = 0.0002  # as bench_exporter: 0.2 ms per NVML call, 20 ms per PCIe sample
PCIE_LATENCY_S = 0.02
ROUNDS = 60  # collections each way, alternating
INTERVAL_S = 1.0


def readers_alone(root: Path) -> None:
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


def _poller(root: Path, *, fabric: bool, spent: list[float]) -> tuple[Poller, NvmlSource]:
    nvml = FakeNvml.h100_node(gpus=8, clock=SystemClock(), latency_s=CALL_LATENCY_S, pcie_latency_s=PCIE_LATENCY_S)
    for index, gpu in enumerate(nvml.gpus):
        gpu.pci_bus_id = GPU_BUS_IDS[index]
        gpu.processes = [(JOB_PIDS[index], 1 << 30)]
    source = NvmlSource("bench", nvml=nvml)
    steps: list[Enricher] = [JobMapper(proc_root=str(V2_PROC)).enrich]
    if fabric:
        reader = FabricReader("bench", sysfs_root=str(root), proc_root=str(V2_PROC))

        def timed(snapshot: NodeSnapshot) -> NodeSnapshot:
            started = time.thread_time()
            enriched = reader.enrich(snapshot)
            spent.append(time.thread_time() - started)
            return enriched

        steps.append(timed)

    def enrich(snapshot: NodeSnapshot) -> NodeSnapshot:
        for step in steps:
            snapshot = step(snapshot)
        return snapshot

    return Poller(source, interval_s=INTERVAL_S, enrich=enrich), source


def _render_cost(snapshot: NodeSnapshot, times: int = 200) -> float:
    """Median thread CPU of rendering /metrics and gzipping it, as a collection does."""
    costs = []
    for _ in range(times):
        started = time.thread_time()
        gzip.compress(render_metrics(snapshot, ExporterHealth()), compresslevel=1)
        costs.append(time.thread_time() - started)
    return statistics.median(costs)


def exporter_with_and_without(root: Path) -> None:
    spent: list[float] = []
    plain, plain_source = _poller(root, fabric=False, spent=spent)
    full, full_source = _poller(root, fabric=True, spent=spent)
    try:
        for poller in (plain, full):  # warm: NVML start-up, affinity cache, first renders
            poller.collect_once()
            poller.collect_once()
        snapshot = full.published().snapshot
        assert snapshot is not None
        assert (len(snapshot.gpus), len(snapshot.nics), len(snapshot.job_hosts)) == (8, 8, 8), snapshot.errors
        assert not [r for r in snapshot.errors if r.startswith(("ib_", "affinity_", "host_", "fabric_"))]
        spent.clear()
        costs: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(ROUNDS):
            for fabric, poller in ((False, plain), (True, full)):
                cpu = time.process_time()
                poller.collect_once()
                costs[fabric].append(time.process_time() - cpu)
        without, with_fabric = statistics.median(costs[False]), statistics.median(costs[True])
        added = with_fabric - without
        body_plain, body_full = len(plain.published().metrics), len(full.published().metrics)
        read = statistics.median(spent)
        render = _render_cost(snapshot) - _render_cost(snapshot.replace(nics=(), host=None, job_hosts=()))
    finally:
        plain_source.close()
        full_source.close()
    direct = read + render
    print(f"fabric_exporter_collect_cpu_8gpu: {without * 1e3:.2f} ms")
    print(f"fabric_exporter_collect_cpu_8gpu_8nic_fabric: {with_fabric * 1e3:.2f} ms")
    print(f"fabric_exporter_added_cpu_ab_difference: {added * 1e3:.2f} ms")
    print(f"fabric_exporter_read_cpu_per_collection: {read * 1e3:.2f} ms")
    print(f"fabric_exporter_render_cpu_per_collection: {render * 1e3:.2f} ms")
    print(f"fabric_exporter_added_cpu_per_collection: {direct * 1e3:.2f} ms")
    print(f"fabric_exporter_added_cpu_1s_interval: {direct / INTERVAL_S * 100:.2f} % of one core")
    print(f"fabric_exporter_cpu_8gpu_1s_interval: {without / INTERVAL_S * 100:.2f} % of one core")
    print(f"fabric_exporter_cpu_8gpu_8nic_1s_interval: {(without + direct) / INTERVAL_S * 100:.2f} % of one core")
    print(f"fabric_exporter_metrics_fabric_added_body: {(body_full - body_plain) / 1024:.1f} KiB")


def main() -> int:
    options.no_arguments(__spec__.name if __spec__ else __name__, __doc__)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "sysfs"
        shutil.copytree(SYSFS, root, symlinks=True)
        for extra in ("mlx5_8", "mlx5_9"):
            (root / "sys" / "class" / "infiniband" / extra).unlink()
        shutil.copytree(V2_CGROUP, root / "sys" / "fs" / "cgroup", symlinks=True)
        readers_alone(root)
        exporter_with_and_without(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
