"""The job page's bandwidth panel: the bus bandwidth NCCL's Inspector measured for the job's collectives, against
what the job's links can carry.

Read from the store (``StoreReader.job_bandwidth``: the SQL store's ``gpulens.storage.inspectorstore``, or the
exporters' series over Prometheus). One row per communicator, collective and message-size class: the newest measure
(the fastest node's, as JobCommunicationSlow weighs it), the best in the range, the node whose ranks measured least
now, and the ceiling of the links the collective crosses, per GPU: the GPU's NVLink (all links, one direction) for a
job within one node, the RDMA ports its nodes' GPUs share for a job across nodes (the port rates of each node over
the job's GPUs there, the smallest node's), from ``gpulens.hardware`` and the stored ports.
"""

from __future__ import annotations

from collections.abc import Sequence

from dash import html

from gpulens.dashboard.components import Cell, ViewState, link, panel, table
from gpulens.dashboard.fabric import Unavailable
from gpulens.dashboard.formatting import percent_text
from gpulens.dashboard.paths import node_path
from gpulens.dashboard.unavailable import Missing, attempt
from gpulens.fabricmodel import NicReading
from gpulens.hardware import find_gpu_model
from gpulens.ncclinspect import BandwidthPoint
from gpulens.storage.reading import StoreReader
from gpulens.storage.records import GpuInfo


def read_bandwidth(store: StoreReader, job_id: str, start: float, end: float) -> list[BandwidthPoint] | Missing:
    """The job's measures in [start, end], or what says that the store keeps none."""
    return attempt(lambda: store.job_bandwidth(job_id, start, end))


def link_ceiling(ports: Sequence[NicReading] | Unavailable, gpus: Sequence[GpuInfo]) -> tuple[float | None, str]:
    """What one GPU's links carry for the job's collectives, and which links: NVLink within one node, the RDMA
    ports across nodes (``ports``: the ports the job page already read of the job's nodes; None where unknown)."""
    nodes = sorted({g.node for g in gpus})
    if len(nodes) == 1:
        facts = find_gpu_model(gpus[0].model) if gpus else None
        ceiling = facts.nvlink_max_bytes_per_second if facts is not None else 0.0
        return (ceiling or None), "NVLink"
    if isinstance(ports, Unavailable):
        return None, "network"
    shares = []
    for node in nodes:
        rate = sum(p.rate_bytes_per_second or 0.0 for p in ports if p.node == node and p.up)
        held = sum(1 for g in gpus if g.node == node)
        shares.append(rate / held if held else 0.0)
    smallest = min(shares, default=0.0)
    return (smallest or None), "network"


def _gb(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e9:.1f} GB/s"


def bandwidth_panel(
    found: Sequence[BandwidthPoint] | Missing,
    ceiling: tuple[float | None, str],
    state: ViewState | None = None,
) -> html.Div | None:
    """One row per communicator, collective and size; None where nothing was measured or the store keeps none."""
    if isinstance(found, Missing) or not found:
        return None
    limit, links = ceiling
    keys = sorted({(p.comm, p.collective, p.size) for p in found})
    rows: list[list[Cell]] = []
    for key in keys:
        points = [p for p in found if (p.comm, p.collective, p.size) == key]
        newest = max(p.time for p in points)
        now = [p for p in points if p.time == newest]
        fastest = max(p.bus_bytes_per_second for p in now)
        low = min(now, key=lambda p: (p.bus_bytes_per_second, p.node))
        best = max(p.bus_bytes_per_second for p in points)
        rows.append(
            [
                key[0],
                key[1],
                key[2],
                _gb(fastest),
                _gb(best),
                link(low.node, node_path(low.node), state) if len(now) > 1 else low.node,
                _gb(limit),
                percent_text(fastest / limit if limit else None),
            ]
        )
    columns = ["communicator", "collective", "size", "now", "best in range", "slowest node", f"{links} per GPU",
               "of the links"]  # fmt: skip
    title = "NCCL: bus bandwidth against the links (NCCL Inspector)"
    return panel(title, table(columns, rows, numeric=["now", "best in range", f"{links} per GPU", "of the links"]))
