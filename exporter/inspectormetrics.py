"""The NCCL Inspector's families of /metrics, rendered from a snapshot's ``inspector`` view.

Each measured series carries ``node, job_id, comm, collective, size`` (``size``: the message-size class, a power of
two such as ``64MiB``); a node keeps at most ``MAX_SERIES`` of them (``gpulens.ncclinspect``), so the series count
is bounded whatever the files say. Values that come from the files (hashes, names) are escaped like any label.
"""

from __future__ import annotations

from collections.abc import Iterator

from gpulens.exporter.promfamily import Family
from gpulens.model import NodeSnapshot

LABELS = ["node", "job_id", "comm", "collective", "size"]


def inspector_families(snapshot: NodeSnapshot) -> Iterator[Family]:
    view = snapshot.inspector
    if view is None:
        return
    node = snapshot.node
    files = Family(
        "gpulens_nccl_inspector_files",
        "NCCL Inspector files (JSON logs and Prometheus files) this node's agent reads.",
        labels=["node"],
    )
    files.add_metric([node], view.files)
    yield files
    dropped = Family(
        "gpulens_nccl_inspector_series_dropped",
        "NCCL Inspector series this node measured but did not keep in its last pass (over the series limit).",
        labels=["node"],
    )
    dropped.add_metric([node], view.dropped_series)
    yield dropped
    bus = Family(
        "gpulens_nccl_bus_bandwidth_bytes_per_second",
        "Bus bandwidth one collective of one message-size class achieved on a job's communicator, as NCCL's "
        "Inspector measured it on this node's ranks (geometric mean over the collectives last read).",
        labels=LABELS,
    )
    seconds = Family(
        "gpulens_nccl_collective_seconds",
        "Mean time one collective of one message-size class took on a job's communicator, as NCCL's Inspector "
        "measured it on this node's ranks.",
        labels=LABELS,
    )
    for s in view.series:
        values = [node, s.job_id or "", s.comm, s.collective, s.size]
        bus.add_metric(values, s.bus_bytes_per_second)
        seconds.add_metric(values, s.seconds)
    yield bus
    yield seconds
