"""NCCL's own view of a job, as the node agent reads it from NCCL RAS: records shared by every layer.

One ``NcclView`` per node snapshot: whether RAS answered, and the communicators and ranks of the jobs on this node,
each rank mapped to gpulens's own records (GPU UUID, job, node). Only the ranks that run on this node are kept, so the
number of series is bounded by the node's GPUs whatever a RAS answer claims, and a bounded few of other nodes' ranks
that stand out in this node's answer (``is_remote``), so that a hang is named without waiting for their node's turn.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

# A rank's state as RAS sees it: it answered, or it is missing from the answer (INCOMPLETE), unresponsive (RAS could
# not reach its process within the query's timeout) or considered dead (RAS lost its process).
RANK_OK: Final = "ok"
RANK_MISSING: Final = "missing"
RANK_UNRESPONSIVE: Final = "unresponsive"
RANK_DEAD: Final = "dead"
RANK_STATES: Final = (RANK_OK, RANK_MISSING, RANK_UNRESPONSIVE, RANK_DEAD)

# How long a communicator's counts must hold the same mismatch before ``CommunicationStall`` names the ranks behind
# (the rule's ``ras_mismatch_for`` by default); the node agent confirms a new mismatch this long after it saw it.
MISMATCH_HOLD_S: Final = 30.0


@dataclass(frozen=True)
class NcclRank:
    """One rank of one communicator that runs on this node, or another node's rank that stands out in this node's
    answer (``is_remote``)."""

    job_id: str | None
    # the communicator's hash, 16 hex digits; "<hash>-<host hash>-<pid hash>" where two of the answer's share it
    comm: str
    rank: int
    host: str  # the IP address RAS reports for the rank's process
    pid: int | None = None
    gpu: int | None = None  # NVML index
    gpu_uuid: str | None = None
    # Collective -> operations launched (NCCL's sequence number); only the collectives RAS reported for this rank.
    counts: Mapping[str, int] = field(default_factory=dict)
    lag: int | None = None  # the communicator's highest count minus this rank's, over the collectives
    state: str = RANK_OK
    # This node's own rank behind its communicator: whether its GPU copies memory to the host meanwhile (a checkpoint
    # writer, ``exporter.ncclbusy``); None for ranks not judged (not behind, another node's, no GPU reading).
    busy: bool | None = None


def is_remote(rank: NcclRank) -> bool:
    """A rank of another node that this node's answer showed standing out (``exporter.ncclwide``): its GPU index is
    another node's (-1: unknown), so it maps to none of this node's GPU UUIDs."""
    return rank.gpu is not None and rank.gpu_uuid is None


@dataclass(frozen=True)
class NcclComm:
    """One communicator with at least one rank on this node."""

    job_id: str | None
    comm: str
    size: int  # ranks in the communicator
    status: str  # "OK", "MISMATCH", "INCOMPLETE" or RAS's combination of them ("INCOMPLETE,MISMATCH")
    top_count: int | None = None  # the highest count of ``collective`` over the communicator's ranks
    collective: str | None = None  # the collective whose counts differ most (or the busiest one when all agree)
    mismatch_age_s: float | None = None  # how long the same mismatch has held; None while the counts agree


@dataclass(frozen=True)
class NcclView:
    """What this node's agent last learnt from NCCL RAS."""

    up: bool  # the last query got a whole answer
    query_seconds: float | None = None  # how long the last query took
    age_s: float = 0.0  # how old the answer below is (the agent queries in turns with the job's other nodes)
    format: str | None = None  # "json" or "text"
    version: str | None = None  # the NCCL version RAS reported
    error: str | None = None  # why the last query failed, one line
    comms: tuple[NcclComm, ...] = ()
    ranks: tuple[NcclRank, ...] = ()
