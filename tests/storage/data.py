"""Snapshot builders for the storage tests, on top of the exporter tests' fixed H100 readings."""

from __future__ import annotations

from gpulens.model import GpuJob, LinkReading, NodeSnapshot, ProcessReading
from tests.fakes.static_source import GIB, h100


def snapshot(
    node: str,
    t: float,
    *,
    gpus: int = 2,
    job: str | None = None,
    user: str = "alice",
    down_links: tuple[int, ...] | None = None,
    **changes: object,
) -> NodeSnapshot:
    """``gpus`` H100 readings at ``t`` (each with ``changes``), optionally held by ``job`` and with NVLink states."""
    readings = tuple(h100(node, i, t, **changes) for i in range(gpus))
    jobs = tuple(GpuJob(node, g.gpu, g.uuid, job, user) for g in readings) if job else ()
    processes = (
        tuple(ProcessReading(node, g.gpu, g.uuid, 4000 + g.gpu, 10 * GIB, "python", user, job) for g in readings)
        if job
        else ()
    )
    links = (
        tuple(
            LinkReading(node, g.gpu, g.uuid, link, link not in down_links, remote_pci_bus_id=f"remote-{link}")
            for g in readings
            for link in range(4)
        )
        if down_links is not None
        else ()
    )
    return NodeSnapshot(
        node=node, timestamp=t, source="test", gpus=readings, jobs=jobs, processes=processes, links=links
    )


def uuid_of(node: str, index: int) -> str:
    return h100(node, index, 0.0).uuid
