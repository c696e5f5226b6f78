"""NCCL's Inspector over Prometheus: each node's bus bandwidth and collective time per job and communicator, and a
job's bandwidth over time, from the exporters' ``gpulens_nccl_bus_bandwidth_bytes_per_second`` and
``gpulens_nccl_collective_seconds``, as the SQL store keeps them (``storage.inspectorstore``).

A mix-in of ``gpulens.storage.prometheus.reader.PromReader`` (its module is full). The slowest rank of a node is in
the snapshot and the SQL store only: Prometheus has no series for it, so its views name none.
"""

from __future__ import annotations

from typing import Final

from gpulens.clock import Clock
from gpulens.ncclinspect import BandwidthPoint, InspectorSeries, InspectorView
from gpulens.storage.prometheus.client import PromClient, quote

BUS: Final = "gpulens_nccl_bus_bandwidth_bytes_per_second"
SECONDS: Final = "gpulens_nccl_collective_seconds"
_KEY: Final = ("node", "job_id", "comm", "collective", "size")
MAX_POINTS: Final = 240  # steps of a job's range query


class InspectorReads:
    """The Inspector reads of the store interface (``storage.reading.StoreReader``)."""

    client: PromClient
    clock: Clock

    def latest_inspector(self, *, max_age_s: float) -> dict[str, InspectorView]:
        now = self.clock.now()
        fresh = f"{now - max_age_s:.3f}"
        bus = self.client.query(f"{BUS} and timestamp({BUS}) > {fresh}", now)
        seconds = {
            tuple(s.labels.get(k, "") for k in _KEY): s.value
            for s in self.client.query(f"{SECONDS} and timestamp({SECONDS}) > {fresh}", now)
        }
        by_node: dict[str, list[InspectorSeries]] = {}
        for s in sorted(bus, key=lambda s: tuple(s.labels.get(k, "") for k in _KEY)):
            node, job, comm, collective, size = (s.labels.get(k, "") for k in _KEY)
            took = seconds.get((node, job, comm, collective, size), 0.0)
            by_node.setdefault(node, []).append(
                InspectorSeries(job or None, comm, collective, size, s.value, took, samples=1, ranks=0)
            )
        return {node: InspectorView(files=0, records=0, series=tuple(held)) for node, held in by_node.items()}

    def job_bandwidth(self, job_id: str, start: float, end: float) -> list[BandwidthPoint]:
        step = max(10.0, (end - start) / MAX_POINTS)
        found = self.client.query_range(f"{BUS}{{job_id={quote(job_id)}}}", start, end, step)
        points: list[BandwidthPoint] = []
        for s in found:
            node, comm, collective, size = (s.labels.get(k, "") for k in ("node", "comm", "collective", "size"))
            points.extend(BandwidthPoint(t, node, comm, collective, size, v) for t, v in s.samples)
        return sorted(points, key=lambda p: (p.time, p.node))
