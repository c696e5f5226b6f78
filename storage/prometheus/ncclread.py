"""NCCL's view of the jobs over Prometheus: each node's communicators out of step and the ranks that stand out, from
the exporters' ``gpulens_nccl_*`` families, as the SQL store keeps them (``storage.ncclstore.latest_views``).

Five instant queries, each answering only what stands out (most of a healthy cluster answers nothing): the ranks
RAS considers dead or cannot reach, the ranks behind their communicator, those of them their own node sees busy
copying to the host (a checkpoint writer), and the communicators whose
counts have disagreed for a while (``gpulens_nccl_mismatch_age_seconds``). The collective and its counts are not
rebuilt: the stall rules weigh the states, lags, busy writers and the mismatch's age.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Final, Protocol

from gpulens.clock import Clock
from gpulens.ncclmodel import RANK_DEAD, RANK_OK, RANK_UNRESPONSIVE, NcclComm, NcclRank, NcclView
from gpulens.storage.prometheus.client import PromClient, PromSeries


class PromReader(Protocol):
    """What this read uses of ``gpulens.storage.prometheus.reader.PromReader`` (which calls it): no import of it,
    which would be a circle."""

    client: PromClient
    clock: Clock

    def parallel(self, *calls: Callable[[], Any]) -> list[Any]: ...


# (family, filter): the series of each that stand out
QUERIES: Final = (
    ("gpulens_nccl_rank_dead", "== 1"),
    ("gpulens_nccl_rank_unresponsive", "== 1"),
    ("gpulens_nccl_rank_lag", "> 0"),
    ("gpulens_nccl_mismatch_age_seconds", ">= 0"),
    ("gpulens_nccl_rank_busy", "== 1"),
)


def _key(s: PromSeries) -> tuple[str, str, str, int]:
    """A rank series' (node, job, communicator, rank)."""
    labels = s.labels
    return labels.get("node", ""), labels.get("job_id", ""), labels.get("comm", ""), int(labels.get("rank", -1))


def latest_nccl(reader: PromReader, *, max_age_s: float) -> dict[str, NcclView]:
    """Each node's NCCL view now (series newer than ``max_age_s``), by node; nodes where nothing stands out have
    none."""
    now = reader.clock.now()
    fresh = f"{now - max_age_s:.3f}"
    queries = [f"({family} {test}) and timestamp({family}) > {fresh}" for family, test in QUERIES]
    dead, unresponsive, behind, mismatch, busy = reader.parallel(
        *[lambda q=q: reader.client.query(q, now) for q in queries]
    )
    ranks: dict[tuple[str, str, str, int], NcclRank] = {}

    def place(series: list[PromSeries], state: str) -> None:
        for s in series:
            key = _key(s)
            if key not in ranks:  # dead first, then unresponsive, then behind: the gravest state wins
                lag = int(s.value) if state == RANK_OK else None
                ranks[key] = NcclRank(key[1] or None, key[2], key[3], "", lag=lag, state=state)

    place(dead, RANK_DEAD)
    place(unresponsive, RANK_UNRESPONSIVE)
    place(behind, RANK_OK)
    for b in busy:  # its own node saw the rank behind copy to the host (exporter.ncclbusy)
        known = ranks.get(_key(b))
        if known is not None:
            ranks[_key(b)] = dataclasses.replace(known, busy=True)
    comms: dict[str, list[NcclComm]] = {}
    for s in mismatch:
        node, job, comm = (s.labels.get(k, "") for k in ("node", "job_id", "comm"))
        comms.setdefault(node, []).append(NcclComm(job or None, comm, 0, "MISMATCH", mismatch_age_s=s.value))
    by_node: dict[str, list[NcclRank]] = {}
    for (node, *_), rank in sorted(ranks.items()):
        by_node.setdefault(node, []).append(rank)
    return {
        node: NcclView(True, comms=tuple(comms.get(node, ())), ranks=tuple(by_node.get(node, ())))
        for node in sorted(set(comms) | set(by_node))
    }
