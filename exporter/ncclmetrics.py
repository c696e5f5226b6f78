"""The NCCL families of /metrics (``gpulens_nccl_*``), rendered from a snapshot's ``nccl`` view (NCCL RAS).

Every series carries ``node``. Rank series carry ``job_id, comm, rank`` (``comm`` is the communicator's hash, 16 hex
digits, with its secondary hash where two communicators share it); only this node's ranks are exported, so the series
count is bounded by the node's GPUs, and a bounded few of other nodes' ranks that stand out in this node's answer (lag
and state, never counts; ``exporter.ncclwide``). Values that come from RAS's answer (hashes, collective names, host
addresses) are escaped like any other label. A rank's counts are NCCL's sequence numbers: they only grow while the job
runs, so
``gpulens_nccl_collective_launched_total`` is a counter.
"""

from __future__ import annotations

from collections.abc import Iterator

from gpulens.exporter.promfamily import Family, render_labels
from gpulens.model import NodeSnapshot
from gpulens.ncclmodel import RANK_DEAD, RANK_OK, RANK_UNRESPONSIVE, is_remote


def nccl_families(snapshot: NodeSnapshot) -> Iterator[Family]:
    view = snapshot.nccl
    if view is None:
        return
    node = snapshot.node
    up = Family(
        "gpulens_nccl_ras_up",
        "1 when this node's last NCCL RAS query got a whole report, 0 when it failed (no job listening, timeout, "
        "unreadable answer).",
        labels=["node"],
    )
    up.add_metric([node], view.up)
    yield up
    seconds = Family(
        "gpulens_nccl_ras_query_seconds", "How long this node's last NCCL RAS status query took.", labels=["node"]
    )
    if view.query_seconds is not None:
        seconds.add_metric([node], view.query_seconds)
    yield seconds
    launched = Family(
        "gpulens_nccl_collective_launched_total",
        "Collective operations of one type a rank has launched (NCCL's sequence number, from RAS); a rank whose "
        "count stays below its communicator's never arrived.",
        labels=["node", "job_id", "comm", "collective", "rank", "gpu_uuid"],
        type="counter",
    )
    lag = Family(
        "gpulens_nccl_rank_lag",
        "Operations this rank is behind its communicator: the highest count of any rank minus this rank's (this "
        "node's ranks, and other nodes' ranks behind in this node's answer).",
        labels=["node", "job_id", "comm", "rank"],
    )
    unresponsive = Family(
        "gpulens_nccl_rank_unresponsive",
        "1 while NCCL RAS cannot reach this rank's process (stopped, hung or gone), else 0.",
        labels=["node", "job_id", "comm", "rank"],
    )
    dead = Family(
        "gpulens_nccl_rank_dead",
        "1 once NCCL RAS considers this rank's process dead (unreachable for 60 s), else 0.",
        labels=["node", "job_id", "comm", "rank"],
    )
    busy = Family(
        "gpulens_nccl_rank_busy",
        "1 while this node's rank behind its communicator copies memory to the host (its GPU's PCIe TX: a checkpoint "
        "writer, not a hung rank), 0 while it moves nothing; absent for ranks not behind and other nodes' ranks.",
        labels=["node", "job_id", "comm", "rank"],
    )
    for r in view.ranks:
        prefix = render_labels(("node", "job_id", "comm", "rank"), (node, r.job_id or "", r.comm, str(r.rank)))
        if r.busy is not None:
            busy.add_rendered(prefix, r.busy)
        for collective, count in sorted(r.counts.items()) if not is_remote(r) else ():
            labels = (
                render_labels(("collective",), (collective,)) + "," + render_labels(("gpu_uuid",), (r.gpu_uuid or "",))
            )
            launched.add_rendered(prefix + "," + labels, count)
        if r.lag is not None and r.state == RANK_OK:
            lag.add_rendered(prefix, r.lag)
        unresponsive.add_rendered(prefix, r.state in (RANK_UNRESPONSIVE, RANK_DEAD))
        dead.add_rendered(prefix, r.state == RANK_DEAD)
    yield launched
    yield lag
    yield unresponsive
    yield dead
    yield busy
    age = Family(
        "gpulens_nccl_mismatch_age_seconds",
        "How long a communicator has shown the same mismatch of collective counts (unchanged across RAS queries); "
        "0 when a new mismatch appears, absent while the counts agree.",
        labels=["node", "job_id", "comm"],
    )
    for c in view.comms:
        if c.mismatch_age_s is not None:
            age.add_metric([node, c.job_id or "", c.comm], c.mismatch_age_s)
    yield age
