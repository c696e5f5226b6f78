"""Which of this node's ranks behind their communicator are busy writing a checkpoint: their GPU copies memory to
the host.

A job that saves from some ranks alone leaves those ranks one collective behind in NCCL RAS for the whole save, as a
hung rank would be (``alerts.ncclchecks``). The difference lies in the rank's own activity: a writer's GPU copies the
state to the host (PCIe TX traffic), a rank stuck in a dead lock moves nothing. The agent judges each of its own
ranks, behind in its own answer or not, from its own GPU readings of the same snapshot: in a big job the writer's node
may not have queried RAS since the save began, while another node's answer already shows the writer behind, and the
rule then needs the writer's own node to say it is busy. Other nodes' ranks stay unjudged (``None``).
"""

from __future__ import annotations

import dataclasses
from typing import Final

from gpulens.model import NodeSnapshot
from gpulens.ncclmodel import RANK_OK, is_remote

# PCIe TX at or above this: the GPU copies to the host. An idle or spinning GPU sends a few MB/s (its
# driver's and the agent's own reads); a device-to-host copy of a checkpoint moves GB/s.
BUSY_PCIE_TX_MIN_BYTES_PER_SECOND: Final = 256 * 2**20


def mark_busy(snapshot: NodeSnapshot) -> NodeSnapshot:
    """``snapshot`` with each of its own ranks judged busy or not from its GPU's PCIe TX."""
    view = snapshot.nccl
    if view is None or not view.ranks:
        return snapshot
    tx = {g.uuid: g.pcie_tx_bytes_per_second for g in snapshot.gpus if g.uuid}
    ranks = []
    for r in view.ranks:
        busy = None
        if r.state == RANK_OK and not is_remote(r) and r.gpu_uuid is not None:
            rate = tx.get(r.gpu_uuid)
            busy = None if rate is None else rate >= BUSY_PCIE_TX_MIN_BYTES_PER_SECOND
        ranks.append(r if r.busy == busy else dataclasses.replace(r, busy=busy))
    return snapshot.replace(nccl=dataclasses.replace(view, ranks=tuple(ranks)))
