"""One NCCL RAS status report as gpulens keeps it, and the bounds every answer is read within.

A RAS answer is untrusted (any local process can answer on the RAS port), so both readers (text and JSON) build the
report through one ``ReportBuilder`` that caps every dimension as it reads: ranks read (``MAX_RANKS_READ``, each rank
counted, not each line), communicators (``MAX_COMMS``), ranks kept (those the caller wants, at most ``max_kept``; an
answer naming twice that many for the caller is refused there),
hosts per communicator (``MAX_COMM_HOSTS``) and processes RAS lost (``MAX_LOST``). A rank that is read but not kept
still counts in its communicator's aggregates: the highest and lowest count per collective and a fingerprint of every
rank's counts and state, which is all the agent needs of the ranks of other nodes. Communicators are told apart by
their hash and, in JSON, their ``secondary_hash``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from gpulens.ncclmodel import RANK_OK

MAX_COMMS: Final = 4096  # communicators read per answer
MAX_RANKS_READ: Final = 1 << 17  # rank entries read per answer, over all communicators
MAX_RANK: Final = 1 << 20  # the highest rank number accepted
MAX_KEPT_RANKS: Final = 4096  # rank entries kept per answer (the reader asks for fewer: its own GPUs' room)
MAX_OTHER_RANKS: Final = 4096  # ranks of other nodes kept per answer, where the caller asks (``max_others``)
MAX_COMM_HOSTS: Final = 1024  # distinct hosts remembered per communicator
MAX_LOST: Final = 1024  # processes RAS lost (DEAD, INCOMPLETE) remembered per answer
MAX_COUNT: Final = (1 << 63) - 1
ALL_COLLECTIVES: Final = "all"  # NCCL 2.24's text counts every collective together
_MASK: Final = (1 << 64) - 1

# host, pid -> whether the caller wants this rank kept (its ranks on this node); None keeps every rank
Wanted = Callable[[str | None, int | None], bool]


@dataclass(frozen=True, slots=True)
class LocalProcesses:
    """A ``Wanted`` that says which: the ranks on one of these hosts or of one of these pids. Knowing them, the text
    reader finds this node's lines in a long run of other nodes' ranks by searching for them, without reading each
    line (``ncclrasparse``)."""

    hosts: frozenset[str]
    pids: frozenset[int]

    def __call__(self, host: str | None, pid: int | None) -> bool:
        return host in self.hosts or pid in self.pids


class RasFormatError(ValueError):
    """The answer is not a RAS status report, or one beyond the bounds."""


@dataclass(slots=True)
class RasRank:
    rank: int
    host: str | None = None
    pid: int | None = None
    cuda_dev: int | None = None
    nvml_dev: int | None = None
    counts: dict[str, int] = field(default_factory=dict)
    state: str = RANK_OK
    error: str | None = None  # the asynchronous error the rank reported (text: NCCL's words; JSON: its name)
    init_state: int | None = None  # JSON: the communicator's init result on this rank (ncclResult_t, 0: success)
    status: str | None = None  # text: the status word NCCL printed for it (RUNNING, ABORT, NOCOMM, ...)


@dataclass
class RasComm:
    comm: str  # 16 lower-case hex digits
    secondary: str | None = None  # JSON "secondary_hash" ("0x..:0x..", lower case): rank 0's host and pid hashes
    size: int | None = None
    status: set[str] = field(default_factory=set)
    ranks: dict[int, RasRank] = field(default_factory=dict)  # the ranks kept (see ReportBuilder)
    # Collective -> the highest / lowest count over the answering ranks, those not kept included.
    top: dict[str, int] = field(default_factory=dict)
    low: dict[str, int] = field(default_factory=dict)
    # Text only: collective -> the count of the first "N ranks have ..." line (the ranks at it are not named).
    majority: dict[str, int] = field(default_factory=dict)
    fingerprint: int = 0  # a sum of every rank's (rank, state, counts): equal while nothing moves
    hosts: set[str] = field(default_factory=set)  # the hosts of its ranks, at most MAX_COMM_HOSTS
    ranks_read: int = 0
    async_errors: int = 0  # text: "Asynchronous error on N ranks" (2.30's ncclTimeout is counted, never named)
    wanted: bool = False  # holds a rank the caller wants

    @property
    def key(self) -> tuple[str, str | None]:
        return (self.comm, self.secondary)

    def note_count(self, collective: str, count: int) -> None:
        if count > self.top.get(collective, -1):
            self.top[collective] = count
        if count < self.low.get(collective, MAX_COUNT + 1):
            self.low[collective] = count

    def note(self, item: object) -> None:
        self.fingerprint = (self.fingerprint + hash(item)) & _MASK

    def differing(self) -> dict[str, int]:
        """Collective -> its top count, for the collectives whose counts differ over the answering ranks."""
        return {name: top for name, top in self.top.items() if self.low.get(name, top) != top}


@dataclass
class RasReport:
    format: str  # "json" or "text"
    version: str | None = None
    comms: list[RasComm] = field(default_factory=list)
    # Text only: processes RAS considers dead or could not reach, as (host, pid) - the ranks they ran take that state.
    dead: set[tuple[str, int]] = field(default_factory=set)
    unresponsive: set[tuple[str, int]] = field(default_factory=set)
    gpu_of: dict[tuple[str, int], int] = field(default_factory=dict)  # text: such a process's first GPU (NVML)
    nodes_total: int | None = None  # text: the job summary's total node count
    timeouts: int | None = None  # communication timeouts while RAS gathered the answer (TIMEOUT, timeouts_count)
    collection_s: float | None = None  # how long RAS took to gather it
    ranks_read: int = 0
    ranks_dropped: int = 0  # wanted ranks read past ``max_kept``
    comms_duplicate: int = 0  # communicators named twice with the same hash and secondary hash (the first is kept)


def comm_hash(raw: str) -> str:
    text = raw.strip().lower()
    if text.startswith("0x"):
        text = text[2:]
    if not text or len(text) > 16 or any(c not in "0123456789abcdef" for c in text):
        raise RasFormatError(f"communicator hash {raw[:40]!r} is not 64-bit hexadecimal")
    return text.rjust(16, "0")


def bounded_rank(value: int) -> int:
    if not 0 <= value <= MAX_RANK:
        raise RasFormatError(f"rank {value} is not in [0, {MAX_RANK}]")
    return value


class ReportBuilder:
    """Builds a ``RasReport`` within the bounds: every rank read goes through ``rank``."""

    def __init__(self, fmt: str, wanted: Wanted | None, max_kept: int, max_others: int = 0) -> None:
        self.report = RasReport(fmt)
        self._wanted = wanted
        self._max_kept = min(max_kept, MAX_KEPT_RANKS)
        self._kept = 0
        # Ranks of other nodes kept beside the wanted ones, first come, up to this many: the reader passes on those
        # that stand out (``exporter.ncclwide``); they never count against the caller's own room.
        self._max_others = min(max_others, MAX_OTHER_RANKS)
        self._others = 0
        self._comms: dict[tuple[str, str | None], RasComm] = {}

    def comm(self, hash_: str, secondary: str | None = None, size: int | None = None) -> RasComm | None:
        """The communicator of that hash (text: its blocks add up); None for a second one of the same key (JSON)."""
        key = (hash_, secondary)
        found = self._comms.get(key)
        if found is not None:
            return found
        if len(self._comms) >= MAX_COMMS:
            raise RasFormatError(f"more than {MAX_COMMS} communicators")
        comm = self._comms[key] = RasComm(hash_, secondary, size)
        return comm

    @property
    def wanted(self) -> Wanted | None:
        return self._wanted

    @property
    def others_full(self) -> bool:
        """No more ranks of other nodes are kept: a rank read now is kept only if the caller wants it."""
        return self._wanted is not None and self._others >= self._max_others

    def known(self, hash_: str, secondary: str | None) -> bool:
        return (hash_, secondary) in self._comms

    def count_read(self, comm: RasComm | None, n: int = 1) -> None:
        self.report.ranks_read += n
        if comm is not None:
            comm.ranks_read += n
        if self.report.ranks_read > MAX_RANKS_READ:
            raise RasFormatError(f"more than {MAX_RANKS_READ} ranks")

    def rank(self, comm: RasComm, rank: int, host: str | None = None, pid: int | None = None) -> RasRank | None:
        """One rank read: counted, its host noted, and the entry to fill when it is kept (None when not)."""
        rank = bounded_rank(rank)
        self.count_read(comm)
        if host is not None and len(comm.hosts) < MAX_COMM_HOSTS:
            comm.hosts.add(host)
        entry = comm.ranks.get(rank)
        if entry is not None:
            if host is not None and entry.host is None:
                entry.host, entry.pid = host, pid
            return entry
        # A rank with no host (2.24 names missing ranks by number) is kept: the reader places it later.
        wanted = self._wanted is None or host is None or self._wanted(host, pid)
        if not wanted:
            if self._others >= self._max_others:
                return None
            self._others += 1
            entry = comm.ranks[rank] = RasRank(rank, host, pid)
            return entry
        if self._kept >= self._max_kept:
            self.report.ranks_dropped += 1
            if self._wanted is not None and self.report.ranks_dropped > self._max_kept:
                # Twice the caller's room on its own node: no job runs that, so the rest is not read.
                raise RasFormatError(f"more than {2 * self._max_kept} ranks on this node")
            return None
        self._kept += 1
        comm.wanted = comm.wanted or host is not None
        entry = comm.ranks[rank] = RasRank(rank, host, pid)
        return entry

    def lost(self, dead: bool, host: str, pid: int, gpu: int) -> None:
        self.count_read(None)
        report = self.report
        if len(report.gpu_of) >= MAX_LOST and (host, pid) not in report.gpu_of:
            return
        (report.dead if dead else report.unresponsive).add((host, pid))
        report.gpu_of[(host, pid)] = gpu

    def drop_comm(self, comm: RasComm) -> None:
        self._kept -= len(comm.ranks)
        self._comms.pop(comm.key, None)

    def finish(self) -> RasReport:
        comms = list(self._comms.values())
        if self._wanted is not None:  # a communicator without a wanted rank is nothing to this caller
            comms = [c for c in comms if c.wanted or any(r.host is None for r in c.ranks.values())]
        self.report.comms = comms
        return self.report
