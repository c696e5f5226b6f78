"""What changed on each GPU since the stored state: its jobs, its processes and its inactive NVLinks.

The writer keeps, per GPU, what the database holds (``GpuState``: open job allocations, open link outages, the
process list) and asks a ``ChangeTracker`` which rows one round opens, closes or replaces (``Changes``). A node whose
snapshot says the same as its previous one costs one tuple comparison (its signature). A snapshot holding only the
inactive links (``LINKS_INACTIVE``) has every other link of a GPU that reads links up.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, filterfalse
from operator import attrgetter
from typing import Any, Final

from gpulens.model import LINKS_ALL, LINKS_INACTIVE, GpuReading, NodeSnapshot

Static = tuple[str, int, str, str | None, str | None, bool | None]
ProcessRow = tuple[int, int | None, str | None, str | None, str | None]


@dataclass(slots=True)
class GpuState:
    """What is stored for one GPU."""

    id: int
    static: Static
    last_ms: int  # the newest reading written
    stored_last_seen_ms: int  # gpu.last_seen_ms in the database
    jobs: dict[str, str | None] = field(default_factory=dict)  # open allocations: job_id -> user
    links_down: set[int] = field(default_factory=set)  # links with an open nvlink_down row
    profile: tuple[tuple[Any, ...], int] | None = None  # the profile values of the last reading, and their id
    processes: tuple[ProcessRow, ...] | None = None  # None: unknown, rewritten on the next reading


Resolved = tuple[GpuReading, GpuState, int]  # a reading, its GPU's state, its time in ms


@dataclass(slots=True)
class _Parts:
    """What one snapshot says about one GPU besides its reading."""

    jobs: dict[str, str | None] = field(default_factory=dict)
    processes: list[ProcessRow] = field(default_factory=list)
    links_down: dict[int, str | None] | None = None  # None when the source reports no links for the GPU


@dataclass(slots=True)
class Changes:
    """The job, link and process rows one write inserts or closes."""

    opened_jobs: dict[tuple[int, str], dict[str, Any]] = field(default_factory=dict)
    finished_jobs: list[dict[str, Any]] = field(default_factory=list)  # opened and closed within the round
    closed_jobs: list[dict[str, Any]] = field(default_factory=list)
    opened_links: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)
    finished_links: list[dict[str, Any]] = field(default_factory=list)
    closed_links: list[dict[str, Any]] = field(default_factory=list)
    process_gpus: list[int] = field(default_factory=list)
    process_rows: list[dict[str, Any]] = field(default_factory=list)


_UUIDS: Final = attrgetter("uuid")
_JOB_KEY: Final = attrgetter("uuid", "job_id", "user")
_PROCESS_KEY: Final = attrgetter("uuid", "pid", "memory_used_bytes", "command", "user", "job_id")
_LINK_KEY: Final = attrgetter("uuid", "link", "remote_pci_bus_id")
_ACTIVE: Final = attrgetter("active")


def _links_unread(reading: GpuReading) -> bool:
    return reading.nvlink_links_active is None


def _signature(snapshot: NodeSnapshot) -> tuple[Any, ...]:
    """Everything about a snapshot that the job, process and link tables depend on, as plain tuples.

    Built with C-level maps: a node reports ~150 NVLink states a scrape.
    """
    return (
        tuple(map(_UUIDS, snapshot.gpus)),
        tuple(map(_JOB_KEY, snapshot.jobs)),
        tuple(map(_PROCESS_KEY, snapshot.processes)),
        bool(snapshot.links) if snapshot.links_scope == LINKS_ALL else tuple(map(_links_unread, snapshot.gpus)),
        tuple(map(_LINK_KEY, filterfalse(_ACTIVE, snapshot.links))),
    )


def _parts(snapshot: NodeSnapshot) -> dict[str, _Parts]:
    parts = {reading.uuid: _Parts() for reading in snapshot.gpus}
    if snapshot.links_scope == LINKS_INACTIVE:  # only the inactive links listed: a GPU that reads links has the rest up
        for reading in snapshot.gpus:
            if reading.nvlink_links_active is not None:
                parts[reading.uuid].links_down = {}
    for p in snapshot.processes:
        part = parts.get(p.uuid)
        if part is not None:
            part.processes.append((p.pid, p.memory_used_bytes, p.command, p.user, p.job_id))
            if p.job_id is not None:
                part.jobs.setdefault(p.job_id, p.user)
    for job in snapshot.jobs:
        part = parts.get(job.uuid)
        if part is not None:
            part.jobs[job.job_id] = job.user or part.jobs.get(job.job_id)
    for link in snapshot.links:
        part = parts.get(link.uuid)
        if part is not None:
            part.links_down = {} if part.links_down is None else part.links_down
            if not link.active:
                part.links_down[link.link] = link.remote_pci_bus_id
    return parts


class ChangeTracker:
    """Compares rounds with the stored state; remembers each node's last signature (``reset()`` after a failure)."""

    def __init__(self) -> None:
        self._signatures: dict[str, tuple[Any, ...] | None] = {}

    def reset(self) -> None:
        self._signatures = {}

    def changes(
        self, snapshots: Sequence[NodeSnapshot], gpus: Mapping[str, GpuState], resolved: Sequence[Resolved] | None
    ) -> Changes:
        """Compare each GPU's jobs, processes and inactive links with what is stored, oldest snapshot first.

        ``resolved``: the snapshots' readings resolved, in order, if the round had no duplicates. A node whose
        snapshot says the same as its previous one (the common case) costs one tuple comparison.
        """
        changes = Changes()
        offsets = list(accumulate((len(s.gpus) for s in snapshots), initial=0))
        for i in sorted(range(len(snapshots)), key=lambda i: snapshots[i].timestamp):
            snapshot = snapshots[i]
            current: Iterable[Resolved] = (
                resolved[offsets[i] : offsets[i + 1]]
                if resolved is not None
                else [(r, gpus[r.uuid], round(r.timestamp * 1000)) for r in snapshot.gpus]
            )
            # An older reading replayed is stored as a sample but must not rewind jobs or links.
            fresh = [(reading, state, ts_ms) for reading, state, ts_ms in current if ts_ms > state.last_ms]
            signature = _signature(snapshot)
            if len(fresh) == len(snapshot.gpus) and signature == self._signatures.get(snapshot.node):
                for _, state, ts_ms in fresh:
                    state.last_ms = ts_ms
                continue
            parts = _parts(snapshot)
            for reading, state, ts_ms in fresh:
                part = parts[reading.uuid]
                if part.jobs != state.jobs:
                    self._job_changes(changes, state, part.jobs, ts_ms)
                if part.links_down is not None and part.links_down.keys() != state.links_down:
                    self._link_changes(changes, state, part.links_down, ts_ms)
                processes = tuple(sorted(part.processes))
                if processes != state.processes:
                    self._process_changes(changes, state, processes, ts_ms)
                state.last_ms = ts_ms
            self._signatures[snapshot.node] = signature if len(fresh) == len(snapshot.gpus) else None
        return changes

    @staticmethod
    def _job_changes(changes: Changes, state: GpuState, current: Mapping[str, str | None], ts_ms: int) -> None:
        for job_id in sorted(state.jobs.keys() - current.keys()):
            del state.jobs[job_id]
            opened = changes.opened_jobs.pop((state.id, job_id), None)
            if opened is not None:  # opened earlier in this round: insert it closed
                changes.finished_jobs.append({**opened, "end_ms": state.last_ms})
            else:
                changes.closed_jobs.append({"b_gpu": state.id, "b_key": job_id, "b_end": state.last_ms})
        for job_id in sorted(current.keys() - state.jobs.keys()):
            state.jobs[job_id] = current[job_id]
            changes.opened_jobs[(state.id, job_id)] = {
                "gpu_id": state.id,
                "job_id": job_id,
                "user_name": current[job_id],
                "start_ms": ts_ms,
                "end_ms": None,
            }

    @staticmethod
    def _link_changes(changes: Changes, state: GpuState, down: Mapping[int, str | None], ts_ms: int) -> None:
        for link in sorted(state.links_down - down.keys()):
            state.links_down.discard(link)
            opened = changes.opened_links.pop((state.id, link), None)
            if opened is not None:
                changes.finished_links.append({**opened, "end_ms": state.last_ms})
            else:
                changes.closed_links.append({"b_gpu": state.id, "b_key": link, "b_end": state.last_ms})
        for link in sorted(down.keys() - state.links_down):
            state.links_down.add(link)
            changes.opened_links[(state.id, link)] = {
                "gpu_id": state.id,
                "link": link,
                "start_ms": ts_ms,
                "end_ms": None,
                "remote_pci_bus_id": down[link],
            }

    @staticmethod
    def _process_changes(changes: Changes, state: GpuState, processes: tuple[ProcessRow, ...], ts_ms: int) -> None:
        state.processes = processes
        changes.process_gpus.append(state.id)
        changes.process_rows += [
            {
                "gpu_id": state.id,
                "pid": pid,
                "seen_ms": ts_ms,
                "memory_used_bytes": memory,
                "command": command,
                "user_name": user,
                "job_id": job_id,
            }
            for pid, memory, command, user, job_id in processes
        ]
