"""The fabric of the dashboard's test cluster, written beside the simulated GPUs: each node's RDMA ports, its host
and its jobs' cgroups, with the states a page must show. The states are chosen here (not by the simulator) so the
pages are tested against known ports whatever the simulator's own defaults become.

- The H100 nodes have 8 x NDR 400 Gb/s InfiniBand ports ``mlx5_0``..``mlx5_7``, port 1, one next to each GPU;
  node-02 also has a RoCE storage port ``mlx5_8`` (200 Gb/s) next to no GPU.
- node-03 (L40S) has none: its exporter reads no RDMA port (what a dcgm-sourced node looks like).
- ``llm-pretrain`` (node-00 and node-01) moves ~55 % of each port's rate until its stall at 40 m, then nothing.
- node-01 ``mlx5_3`` goes down at 30 m (link downed once) and stays down.
- node-00 ``mlx5_5`` counts symbol and receive errors from 25 m to 35 m.
- node-02 ``mlx5_2`` trains at 2X (200 Gb/s) from 10 m: degraded.
- node-02 ``mlx5_5`` (next to the PCIe-saturated GPU 5) runs at ~93 % of its rate from 30 m: saturated.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Final

from gpulens.fabricmodel import HostReading, JobHostReading, NicReading
from gpulens.model import NodeSnapshot

NDR: Final = 50e9  # 400 Gb/s in bytes per second
ROCE_200: Final = 25e9
MULTI_NODE_JOB: Final = "llm-pretrain"
DOWN_PORT: Final = ("node-01", "mlx5_3")
ERROR_PORT: Final = ("node-00", "mlx5_5")
DEGRADED_PORT: Final = ("node-02", "mlx5_2")
SATURATED_PORT: Final = ("node-02", "mlx5_5")
STORAGE_PORT: Final = ("node-02", "mlx5_8")
NO_FABRIC_NODE: Final = "node-03"
CPU_LIMIT_PER_GPU: Final = 8.0  # each job's cgroup may use 8 cores per GPU it holds
GIB: Final = 1024**3


@dataclass
class _Port:
    tx: float = 0.0
    rx: float = 0.0
    wait: float = 0.0
    symbol: int = 0
    receive_errors: int = 0
    downed: int = 0
    was_up: bool = True


@dataclass
class FabricWriter:
    """Adds ports, host and cgroups to each snapshot of a run, counters accumulating from ``start``."""

    start: float
    ports: dict[tuple[str, str], _Port] = field(default_factory=lambda: defaultdict(_Port))
    cpu_seconds: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    last: dict[str, float] = field(default_factory=dict)

    def add(self, snap: NodeSnapshot) -> NodeSnapshot:
        minute = (snap.timestamp - self.start) / 60
        dt = snap.timestamp - self.last.get(snap.node, snap.timestamp)
        self.last[snap.node] = snap.timestamp
        jobs: dict[str, set[int]] = defaultdict(set)
        for j in snap.jobs:
            jobs[j.job_id].add(j.gpu)
        nics = () if snap.node == NO_FABRIC_NODE else self._nics(snap, minute, dt, jobs)
        return snap.replace(nics=nics, host=self._host(snap, minute), job_hosts=self._job_hosts(snap, minute, dt, jobs))

    def _nics(self, snap: NodeSnapshot, minute: float, dt: float, jobs: dict[str, set[int]]) -> tuple[NicReading, ...]:
        devices: list[tuple[str, tuple[int, ...], str, float]] = [
            (f"mlx5_{i}", (i,), "InfiniBand", NDR) for i in range(8)
        ]
        if snap.node == STORAGE_PORT[0]:
            devices.append((STORAGE_PORT[1], (), "Ethernet", ROCE_200))
        multi = jobs.get(MULTI_NODE_JOB, set())
        out = []
        for index, (device, gpus, layer, full_rate) in enumerate(devices):
            key = (snap.node, device)
            port = self.ports[key]
            up = not (key == DOWN_PORT and minute >= 30)
            degraded = key == DEGRADED_PORT and minute >= 10
            rate = full_rate / 2 if degraded else full_rate
            share = 0.01 + 0.005 * index
            if multi.intersection(gpus):
                share = 0.55 + 0.02 * index if minute < 40 else 0.0
            if key == SATURATED_PORT and minute >= 30:
                share = 0.93
            tx_rate = rate * share if up else 0.0
            rx_rate = rate * share * 0.9 if up else 0.0
            wait_rate = 4_000 * share if up else 0.0
            if port.was_up and not up:
                port.downed += 1
            port.was_up = up
            port.tx += tx_rate * dt
            port.rx += rx_rate * dt
            port.wait += wait_rate * dt
            if key == ERROR_PORT and 25 <= minute < 35:
                port.symbol += 3
                port.receive_errors += 1
            first = dt == 0
            out.append(
                NicReading(
                    node=snap.node,
                    device=device,
                    port=1,
                    link_layer=layer,
                    state="ACTIVE" if up else "DOWN",
                    phys_state="LinkUp" if up else "Polling",
                    up=up,
                    rate_bytes_per_second=rate,
                    link_width=2 if degraded else 4,
                    link_speed="NDR" if layer == "InfiniBand" else None,
                    transmit_bytes_total=round(port.tx),
                    receive_bytes_total=round(port.rx),
                    transmit_wait_total=round(port.wait),
                    symbol_errors_total=port.symbol,
                    link_downed_total=port.downed,
                    receive_errors_total=port.receive_errors,
                    local_link_integrity_errors_total=0,
                    transmit_bytes_per_second=None if first else tx_rate,
                    receive_bytes_per_second=None if first else rx_rate,
                    transmit_wait_per_second=None if first else wait_rate,
                    pci_bus_id=f"0000:{0x18 + 0x10 * index:02x}:00.0",
                    numa_node=0 if index < 4 else 1,
                    gpus=gpus,
                )
            )
        return tuple(out)

    def _host(self, snap: NodeSnapshot, minute: float) -> HostReading:
        busy = 0.25 + 0.002 * minute
        total = 2048 * GIB
        used = round(total * (0.3 + 0.001 * minute))
        return HostReading(snap.node, 112, busy, 0.01, total, used, total - used)

    def _job_hosts(
        self, snap: NodeSnapshot, minute: float, dt: float, jobs: dict[str, set[int]]
    ) -> tuple[JobHostReading, ...]:
        out = []
        for job_id, gpus in sorted(jobs.items()):
            limit = CPU_LIMIT_PER_GPU * len(gpus)
            busy = 0.6 if snap.node == "node-00" else 0.5
            used = limit * (busy if minute < 40 else 0.05) if job_id == MULTI_NODE_JOB else limit * 0.3
            key = (snap.node, job_id)
            self.cpu_seconds[key] += used * dt
            out.append(
                JobHostReading(
                    node=snap.node,
                    job_id=job_id,
                    cgroup=f"/system.slice/slurmstepd.scope/job_{job_id}",
                    cgroup_version=2,
                    cpu_seconds_total=self.cpu_seconds[key],
                    cpu_limit_cores=limit,
                    memory_used_bytes=len(gpus) * 64 * GIB,
                    memory_limit_bytes=len(gpus) * 128 * GIB,
                    cpu_used_cores=None if dt == 0 else used,
                )
            )
        return tuple(out)
