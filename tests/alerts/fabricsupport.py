"""Builders for hand-made fabric rounds: RDMA ports, node hosts and jobs' host shares beside the GPUs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpulens.fabricmodel import HostReading, JobHostReading, NicReading
from gpulens.model import GpuReading, NodeSnapshot

from .support import snapshot

NDR = 50e9  # 400 Gb/s, bytes per second
HDR = 25e9


def nic(node: str, device: str, gpus: Sequence[int], **fields: Any) -> NicReading:
    """A healthy, idle NDR InfiniBand port next to ``gpus``; ``fields`` change it."""
    values: dict[str, Any] = {
        "link_layer": "InfiniBand",
        "state": "ACTIVE",
        "phys_state": "LinkUp",
        "up": True,
        "rate_bytes_per_second": NDR,
        "link_width": 4,
        "link_speed": "NDR",
        "transmit_bytes_per_second": 0.0,
        "receive_bytes_per_second": 0.0,
        "transmit_wait_per_second": 0.0,
        "symbol_errors_total": 0,
        "link_downed_total": 0,
        "receive_errors_total": 0,
        "local_link_integrity_errors_total": 0,
    }
    values.update(fields)
    return NicReading(node=node, device=device, port=1, gpus=tuple(gpus), **values)


def down(port: NicReading, downs: int | None = None) -> NicReading:
    """The port gone down (``downs``: its link_downed counter then)."""
    from dataclasses import replace

    return replace(
        port,
        up=False,
        state="DOWN",
        phys_state="Polling",
        transmit_bytes_per_second=0.0,
        receive_bytes_per_second=0.0,
        link_downed_total=port.link_downed_total if downs is None else downs,
    )


def rails(node: str, count: int = 8, **fields: Any) -> list[NicReading]:
    """An HGX node's rails: ``mlx5_i`` next to GPU ``i``."""
    return [nic(node, f"mlx5_{i}", [i], **fields) for i in range(count)]


def host(node: str, **fields: Any) -> HostReading:
    values: dict[str, Any] = {
        "cpus": 64,
        "cpu_busy_ratio": 0.2,
        "cpu_iowait_ratio": 0.01,
        "memory_total_bytes": 1 << 40,
        "memory_used_bytes": 1 << 38,
        "memory_available_bytes": (1 << 40) - (1 << 38),
    }
    values.update(fields)
    return HostReading(node=node, **values)


def share(node: str, job: str, **fields: Any) -> JobHostReading:
    values: dict[str, Any] = {"cpu_limit_cores": 16.0, "cpu_used_cores": 6.0, "memory_used_bytes": 1 << 36}
    values.update(fields)
    return JobHostReading(node=node, job_id=job, **values)


def fabric_snapshot(
    node: str,
    readings: Sequence[GpuReading],
    nics: Sequence[NicReading] = (),
    jobs: Mapping[int, tuple[str, str]] | None = None,
    host_reading: HostReading | None = None,
    job_hosts: Sequence[JobHostReading] = (),
) -> NodeSnapshot:
    base = snapshot(node, readings, jobs)
    return base.replace(nics=tuple(nics), host=host_reading, job_hosts=tuple(job_hosts))
