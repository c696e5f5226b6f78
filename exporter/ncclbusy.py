"""Which of this node's ranks are busy, as a checkpoint writer is: its GPU copies memory to the host, or its process
writes (or reads) storage, or uses CPU.

A job that saves from some ranks alone leaves those ranks one collective behind in NCCL RAS for the whole save, as a
hung rank would be (``alerts.ncclchecks``). The difference lies in the rank's own activity: a writer's GPU copies the
state to the host (PCIe TX traffic), then its process serialises it (CPU) and writes it (storage I/O); a rank stuck in
a dead lock does none of these. The agent judges each of its own ranks, behind in its own answer or not, from the
same snapshot's GPU readings and its processes' activity (``exporter.ncclproc``): in a big job the writer's node may
not have queried RAS since the save began, while another node's answer already shows the writer behind, and the rule
then needs the writer's own node to say it is busy. Other nodes' ranks stay unjudged (``None``), and so does a rank
of which nothing was read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from gpulens.model import NodeSnapshot
from gpulens.ncclmodel import RANK_OK, is_remote

# PCIe TX at or above this: the GPU copies to the host. An idle or spinning GPU sends a few MB/s (its
# driver's and the agent's own reads); a device-to-host copy of a checkpoint moves GB/s.
BUSY_PCIE_TX_MIN_BYTES_PER_SECOND: Final = 256 * 2**20
# Storage bytes read and written by the rank's process at or above this: a checkpoint's write (GB over minutes). A
# waiting rank's logging and metrics writes are KB/s.
BUSY_IO_MIN_BYTES_PER_SECOND: Final = 16 * 2**20
# CPU time of the rank's process at or above this share of one core: it serialises its state. A rank blocked on a
# lock, a queue or a peer sleeps; NCCL's and PyTorch's watchdog threads wake a few times a second.
BUSY_CPU_MIN_CORES: Final = 0.5


@dataclass(frozen=True, slots=True)
class RankActivity:
    """What one rank's process did since the previous collection (``None``: not read, e.g. its first reading)."""

    io_bytes_per_second: float | None = None  # storage bytes read and written
    cpu_cores: float | None = None  # CPU seconds per second, user and system


def judge(tx_bytes_per_second: float | None, activity: RankActivity | None) -> bool | None:
    """Busy when any reading says so; not busy when some reading exists and none does; ``None`` with no reading."""
    io = activity.io_bytes_per_second if activity is not None else None
    cpu = activity.cpu_cores if activity is not None else None
    readings = (
        (tx_bytes_per_second, BUSY_PCIE_TX_MIN_BYTES_PER_SECOND),
        (io, BUSY_IO_MIN_BYTES_PER_SECOND),
        (cpu, BUSY_CPU_MIN_CORES),
    )
    known = [value >= floor for value, floor in readings if value is not None]
    return any(known) if known else None


def mark_busy(snapshot: NodeSnapshot, activity: Mapping[int, RankActivity] | None = None) -> NodeSnapshot:
    """``snapshot`` with each of its own ranks judged busy or not from its GPU's PCIe TX and its process's
    ``activity`` (by pid)."""
    view = snapshot.nccl
    if view is None or not view.ranks:
        return snapshot
    tx = {g.uuid: g.pcie_tx_bytes_per_second for g in snapshot.gpus if g.uuid}
    activity = activity or {}
    ranks = []
    for r in view.ranks:
        busy = None
        if r.state == RANK_OK and not is_remote(r) and r.gpu_uuid is not None:
            busy = judge(tx.get(r.gpu_uuid), activity.get(r.pid) if r.pid is not None else None)
        ranks.append(r if r.busy == busy else dataclasses.replace(r, busy=busy))
    return snapshot.replace(nccl=dataclasses.replace(view, ranks=tuple(ranks)))
