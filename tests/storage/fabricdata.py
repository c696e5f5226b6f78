"""Snapshot builders with RDMA ports, host and job-host readings for the storage tests."""

from __future__ import annotations

import dataclasses

from gpulens.fabricmodel import HostReading, JobHostReading, NicReading
from gpulens.model import NodeSnapshot
from tests.storage.data import snapshot

GIB = 1024**3
NDR = 50e9  # 400 Gb/s in bytes per second


def nic(node: str, k: int, i: int, **changes: object) -> NicReading:
    """Port 1 of ``mlx5_<k>`` at round ``i``: counters grow by a fixed amount a round (10 s apart)."""
    base = NicReading(
        node,
        f"mlx5_{k}",
        1,
        link_layer="InfiniBand",
        state="ACTIVE",
        phys_state="LinkUp",
        up=True,
        rate_bytes_per_second=NDR,
        link_width=4,
        link_speed="NDR",
        transmit_bytes_total=10**9 * i,
        receive_bytes_total=2 * 10**9 * i,
        symbol_errors_total=0,
        link_downed_total=0,
        receive_errors_total=0,
        local_link_integrity_errors_total=0,
        link_error_recovery_total=0,
        transmit_discards_total=0,
        cnp_handled_total=5 * i,
        transmit_bytes_per_second=1e8,
        receive_bytes_per_second=2e8,
        transmit_wait_per_second=12.0,
        cnp_handled_per_second=0.5,
        pci_bus_id=f"0000:{0x17 + k:02x}:00.0",
        numa_node=k // 4,
        gpus=(k,),
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def fabric_snapshot(
    node: str, t: float, i: int, *, nics: int = 2, job: str | None = "j1", **nic_changes: object
) -> NodeSnapshot:
    """Two GPUs, ``nics`` ports, the host and (with ``job``) the job's cgroup, at round ``i`` (time ``t``)."""
    host = HostReading(node, 64, 0.25, 0.02, 2048 * GIB, 512 * GIB, 1536 * GIB)
    jobs = (
        (JobHostReading(node, job, f"/slurm/{job}", 2, 100.0 + 40.0 * i, 8.0, 16 * GIB, 64 * GIB, 4.0),) if job else ()
    )
    return dataclasses.replace(
        snapshot(node, t, gpus=2),
        nics=tuple(nic(node, k, i, **nic_changes) for k in range(nics)),
        host=host,
        job_hosts=jobs,
    )
