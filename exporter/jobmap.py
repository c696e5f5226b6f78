"""Job mapping: which job and user each GPU process (and each GPU) belongs to.

The mapper runs after a source has read a node. For each process it reads exactly three files of
``<proc_root>/<pid>``: ``cgroup`` (the job), ``status`` (the real uid, hence the user) and ``comm`` (the command's
base name), plus ``stat``, whose start time is only a cache key. It never opens ``environ`` or ``cmdline``: both
carry secrets.

Job ids come from the cgroup path (Slurm ``job_<id>``, Kubernetes ``pod/<uid>``, Docker ``docker/<id>``) and from
Slurm prolog files in a job-map directory, named by GPU UUID or index and holding ``<jobid> [<uid>]`` lines (the
jobstats and dcgm-exporter conventions). A GPU named in the job-map directory holds exactly the jobs named there,
whatever the source said (the simulator's scenario included). A job the prolog named by UUID is read from the UUID
files only: its index files follow Slurm's order, which need not be the source's.

Enrichment fails soft: every failure is counted by reason (``jobmap_*``) and the readings pass on.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import logging
import os
import pwd
import re
import stat
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from gpulens.logutil import ErrorCounter
from gpulens.model import GpuJob, GpuReading, NodeSnapshot, ProcessReading

logger = logging.getLogger(__name__)

PROCESS_GONE: Final = "jobmap_process_gone"
PERMISSION_DENIED: Final = "jobmap_permission_denied"
READ_ERROR: Final = "jobmap_read_error"
MALFORMED: Final = "jobmap_malformed"
DIR_UNREADABLE: Final = "jobmap_dir_unreadable"

_MAX_READ_BYTES: Final = 64 * 1024
_MAX_COMMAND_CHARS: Final = 64
_MAX_CACHED_PROCESSES: Final = 4096
_USER_CACHE_SIZE: Final = 256
_STAT_STARTTIME_INDEX: Final = 19  # field 22 of /proc/<pid>/stat, counted from field 3 (the first after "comm)")

# Slurm job ids: digits, array jobs ``123_4``, heterogeneous jobs ``123+0``.
_JOB_ID_CHARS: Final = r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}"
_MAP_JOB_ID: Final = re.compile(_JOB_ID_CHARS)
# Slurm, only from its own cgroup roots, at the start of a hierarchy's path: v1 ``/slurm[_<host>]/uid_<uid>/job_<id>/``,
# v2 ``/system.slice/[<host>_]slurmstepd.scope/job_<id>/`` (``/[<host>_]slurmstepd.scope/job_<id>/`` in a cgroup
# namespace). A Docker container may hold them (Slurm in a container without its own cgroup namespace); a
# ``job_<id>`` anywhere else (a cgroup a pod made for itself) names no Slurm job.
_SLURM_JOB: Final = re.compile(
    r"^(?:/docker/[0-9a-f]{64}|/system\.slice/docker-[0-9a-f]{64}\.scope)?"
    r"/(?:slurm(?:_[^/]+)?/uid_\d+|(?:system\.slice/)?(?:[^/]+_)?slurmstepd\.scope)"
    rf"/job_({_JOB_ID_CHARS})(?:/|$)"
)
# Kubernetes: cgroupfs ``/kubepods/burstable/pod<uid>/<cid>``, systemd ``kubepods-burstable-pod<uid_>.slice``.
# Pod uids are UUIDs, or 32 hex digits for static pods.
_K8S_POD: Final = re.compile(
    r"(?:^|/)[^/]*kubepods[^/]*/(?:[^/]+/)*?(?:[^/]*-)?pod"
    r"([0-9a-f]{8}(?:[-_][0-9a-f]{4}){3}[-_][0-9a-f]{12}|[0-9a-f]{32})(?:\.slice)?(?:/|$)",
    re.IGNORECASE,
)
# Docker: systemd ``docker-<id>.scope``, cgroupfs ``/docker/<id>``.
_DOCKER: Final = re.compile(r"(?:^|/)docker[-/]([0-9a-f]{64})(?:\.scope)?(?:/|$)")
_CGROUP_LINE: Final = re.compile(r"(\d+):([^:]*):(/.*)")
_UID: Final = re.compile(r"[0-9]{1,10}")
_DIGITS: Final = re.compile(r"[0-9]+")


class _ProcessGoneError(Exception):
    """The process exited while (or before) its files were read."""


@dataclass(frozen=True, slots=True)
class _ProcessInfo:
    command: str | None = None
    user: str | None = None
    job_id: str | None = None


@dataclass(frozen=True, slots=True)
class _MappedJob:
    job_id: str
    user: str | None


def _lookup_passwd(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def _owner(path: str) -> tuple[int, str] | None:
    """The outermost scheduler that owns a cgroup path (Slurm or Kubernetes), as (where it starts, job id)."""
    found = []
    if match := _SLURM_JOB.match(path):
        found.append((match.start(), match.group(1)))
    if match := _K8S_POD.search(path):
        found.append((match.start(), "pod/" + match.group(1).replace("_", "-").lower()))
    return min(found) if found else None


def job_id_from_cgroup_paths(paths: Iterable[str]) -> str | None:
    """The job a process belongs to, from its cgroup paths. Where owners nest, the outermost recognised one wins (a
    Slurm-looking cgroup inside a pod is the pod's); a Slurm job before a pod across hierarchies; Docker last, as a
    container is a job only when no scheduler placed it."""
    candidates = list(paths)
    owners = [owner[1] for path in candidates if (owner := _owner(path)) is not None]
    if owners:
        return next((o for o in owners if not o.startswith("pod/")), owners[0])
    for path in candidates:
        if match := _DOCKER.search(path):
            return "docker/" + match.group(1)[:12]
    return None


def _read_text(path: Path) -> str:
    """At most 64 KiB of a regular file.

    Opening with ``O_NONBLOCK`` and refusing anything but a regular file keeps a FIFO or device planted in the
    job-map directory from hanging the collection. Raises ``OSError``.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return handle.read(_MAX_READ_BYTES).decode("utf-8", errors="replace")


class JobMapper:
    """Fills in each process's command, user and job, and lists the jobs that hold each GPU.

    ``proc_root`` is the host's ``/proc`` (NVML reports host PIDs). ``job_map_dir`` is the Slurm prolog's directory
    of per-GPU files (e.g. jobstats' ``/run/gpustat``). ``user_lookup`` maps a uid to a user name (``None`` when
    unknown); the default reads the passwd database. Lookups are cached. ``inspect_processes`` false reads no
    ``/proc`` at all (the simulator's pids are not this host's).

    Fields a source already filled in are kept. Results per process are cached by (pid, start time), so an
    unchanged process costs one read of ``stat`` per collection; pids that leave the snapshot are evicted.
    """

    def __init__(
        self,
        *,
        proc_root: str | Path = "/proc",
        job_map_dir: str | Path | None = None,
        user_lookup: Callable[[int], str | None] | None = None,
        inspect_processes: bool = True,
    ) -> None:
        self._inspect_enabled = inspect_processes
        self._proc_root = Path(proc_root)
        self._job_map_dir = None if job_map_dir is None else Path(job_map_dir)
        self._user_lookup = functools.lru_cache(maxsize=_USER_CACHE_SIZE)(user_lookup or _lookup_passwd)
        self._errors = ErrorCounter(logger)
        self._cache: dict[int, tuple[int, _ProcessInfo]] = {}
        self._lock = threading.Lock()

    @property
    def errors(self) -> Mapping[str, int]:
        """Cumulative failure counts by reason (``jobmap_process_gone``, ``jobmap_permission_denied``, ...)."""
        return self._errors.snapshot()

    def enrich(self, snapshot: NodeSnapshot) -> NodeSnapshot:
        """The snapshot with processes enriched, ``jobs`` completed and this mapper's error counts merged in."""
        with self._lock:
            infos = self._inspect_processes(snapshot.processes) if self._inspect_enabled else {}
            file_jobs = self._read_job_map(snapshot)
        processes = tuple(self._enriched(p, infos.get(p.pid), file_jobs) for p in snapshot.processes)
        mapped = {(job.uuid, job.job_id) for by_uuid in file_jobs.values() for job in by_uuid}
        jobs = _merge_jobs(
            [
                *(job for by_uuid in file_jobs.values() for job in by_uuid),
                # the source's jobs, except on a GPU the job map names (there: only to lend a user to its jobs)
                *(job for job in snapshot.jobs if job.uuid not in file_jobs or (job.uuid, job.job_id) in mapped),
                *_jobs_of_processes(processes),
            ]
        )
        errors = {**snapshot.errors, **self._errors.snapshot()}
        return snapshot.replace(processes=processes, jobs=jobs, errors=errors)

    # --- processes ---------------------------------------------------------------------------------------------

    def _inspect_processes(self, processes: Iterable[ProcessReading]) -> dict[int, _ProcessInfo]:
        """Read each distinct pid that still lacks a field once, then evict cached pids no longer present."""
        infos: dict[int, _ProcessInfo] = {}
        for process in processes:
            complete = None not in (process.command, process.user, process.job_id)
            if not complete and process.pid not in infos:
                infos[process.pid] = self._inspect(process.pid)
        for pid in self._cache.keys() - infos.keys():
            del self._cache[pid]
        return infos

    def _inspect(self, pid: int) -> _ProcessInfo:
        try:
            start_time = self._start_time(pid)
            cached = self._cache.get(pid)
            if cached is not None and start_time is not None and cached[0] == start_time:
                return cached[1]
            info, complete = self._read_process(pid)
        except _ProcessGoneError:
            self._errors.count(PROCESS_GONE, "process %d exited before its job could be read", pid, level=logging.DEBUG)
            self._cache.pop(pid, None)
            return _ProcessInfo()
        if complete and start_time is not None and len(self._cache) < _MAX_CACHED_PROCESSES:
            self._cache[pid] = (start_time, info)
        return info

    def _start_time(self, pid: int) -> int | None:
        """Field 22 of ``/proc/<pid>/stat`` (clock ticks since boot): with the pid, it names one process."""
        path = self._proc_root / str(pid) / "stat"
        text = self._read_proc_file(path)
        if text is None:
            return None
        fields = text.rpartition(")")[2].split()
        if len(fields) > _STAT_STARTTIME_INDEX and _DIGITS.fullmatch(fields[_STAT_STARTTIME_INDEX]):
            return int(fields[_STAT_STARTTIME_INDEX])
        self._errors.count(MALFORMED, "malformed %s: no start time", path)
        return None

    def _read_process(self, pid: int) -> tuple[_ProcessInfo, bool]:
        """The process's command, user and job; ``complete`` is false when any file failed to read or parse."""
        directory = self._proc_root / str(pid)
        cgroup_text = self._read_proc_file(directory / "cgroup")
        status_text = self._read_proc_file(directory / "status")
        comm_text = self._read_proc_file(directory / "comm")
        job_id, job_ok = self._parse_cgroup(directory / "cgroup", cgroup_text)
        user, user_ok = self._parse_status(directory / "status", status_text)
        command = None if comm_text is None else (comm_text.strip()[:_MAX_COMMAND_CHARS] or None)
        complete = job_ok and user_ok and comm_text is not None
        return _ProcessInfo(command=command, user=user, job_id=job_id), complete

    def _parse_cgroup(self, path: Path, text: str | None) -> tuple[str | None, bool]:
        if text is None:
            return None, False
        lines = [line for line in text.splitlines() if line.strip()]
        matches = [_CGROUP_LINE.fullmatch(line) for line in lines]
        paths = [match.group(3) for match in matches if match is not None]
        if not lines or len(paths) < len(lines):
            self._errors.count(MALFORMED, "malformed %s: expected 'id:controllers:/path' lines", path)
            return job_id_from_cgroup_paths(paths), False
        return job_id_from_cgroup_paths(paths), True

    def _parse_status(self, path: Path, text: str | None) -> tuple[str | None, bool]:
        if text is None:
            return None, False
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key == "Uid":
                fields = value.split()
                if fields and _UID.fullmatch(fields[0]):
                    return self._user_name(int(fields[0])), True
                break
        self._errors.count(MALFORMED, "malformed %s: no real uid on a 'Uid:' line", path)
        return None, False

    def _read_proc_file(self, path: Path) -> str | None:
        """The file's text; ``None`` after counting a read failure. Raises ``_ProcessGoneError``."""
        try:
            return _read_text(path)
        except (FileNotFoundError, ProcessLookupError):
            raise _ProcessGoneError from None
        except OSError as exc:
            self._count_os_error(path, exc)
            return None

    def _count_os_error(self, path: Path, exc: OSError) -> None:
        if isinstance(exc, PermissionError):
            self._errors.count(PERMISSION_DENIED, "job mapping is partial: cannot read %s: %s", path, exc)
        else:
            self._errors.count(READ_ERROR, "job mapping is partial: cannot read %s: %s", path, exc)

    def _user_name(self, uid: int) -> str:
        name = self._user_lookup(uid)
        return str(uid) if name is None else name

    def _enriched(
        self, process: ProcessReading, info: _ProcessInfo | None, file_jobs: Mapping[str, list[GpuJob]]
    ) -> ProcessReading:
        gpu_jobs = file_jobs.get(process.uuid)
        job_id = process.job_id
        if gpu_jobs is not None and job_id is not None and job_id not in {j.job_id for j in gpu_jobs}:
            job_id = None  # the source's job is not the one the job map names for this GPU
        if info is None and job_id == process.job_id:
            return process
        info = info or _ProcessInfo()
        job_id = job_id or info.job_id
        if job_id is None and gpu_jobs is not None and len(gpu_jobs) == 1:
            job_id = gpu_jobs[0].job_id
        return dataclasses.replace(
            process,
            command=process.command or info.command,
            user=process.user or info.user,
            job_id=job_id,
        )

    # --- job-map files -----------------------------------------------------------------------------------------

    def _read_job_map(self, snapshot: NodeSnapshot) -> dict[str, list[GpuJob]]:
        """Jobs per GPU UUID from the prolog files: the UUID's file, else the index's file."""
        if self._job_map_dir is None:
            return {}
        try:
            names = set(os.listdir(self._job_map_dir))
        except OSError as exc:
            self._errors.count(DIR_UNREADABLE, "cannot list job-map dir %s: %s", self._job_map_dir, exc)
            return {}
        gpus: dict[str, tuple[str, int]] = {}
        records: list[GpuReading | ProcessReading] = [*snapshot.gpus, *snapshot.processes]
        for record in records:
            gpus.setdefault(record.uuid, (record.node, record.gpu))
        by_uuid = {uuid: self._read_map_file(self._job_map_dir / uuid) for uuid in gpus if uuid in names}
        # Jobs the prolog named by UUID: their index files are not read (Slurm's index order need not be ours).
        named = {job.job_id for mapped in by_uuid.values() for job in mapped}
        jobs: dict[str, list[GpuJob]] = {}
        for uuid, (node, index) in gpus.items():
            if uuid in by_uuid:
                mapped = by_uuid[uuid]
            elif str(index) in names:
                read = self._read_map_file(self._job_map_dir / str(index))
                mapped = [j for j in read if j.job_id not in named]
                if read and not mapped:
                    continue  # only jobs placed by UUID: this index file names some other GPU of ours
            else:
                continue
            jobs[uuid] = [GpuJob(node=node, gpu=index, uuid=uuid, job_id=j.job_id, user=j.user) for j in mapped]
        return jobs

    def _read_map_file(self, path: Path) -> list[_MappedJob]:
        """``<jobid> [<uid>]`` per line; an empty file means no job. Bad lines are counted and skipped."""
        try:
            text = _read_text(path)
        except FileNotFoundError:
            logger.debug("job-map file %s was removed before it could be read", path)
            return []
        except OSError as exc:
            self._count_os_error(path, exc)
            return []
        jobs: list[_MappedJob] = []
        malformed = False
        for line in text.splitlines():
            fields = line.split()
            if not fields:
                continue
            bad_uid = len(fields) == 2 and not _UID.fullmatch(fields[1])
            if len(fields) > 2 or bad_uid or not _MAP_JOB_ID.fullmatch(fields[0]):
                malformed = True
                continue
            user = self._user_name(int(fields[1])) if len(fields) == 2 else None
            jobs.append(_MappedJob(job_id=fields[0], user=user))
        if malformed:
            self._errors.count(MALFORMED, "malformed job-map file %s: expected '<jobid> [<uid>]' lines", path)
        return jobs


def _jobs_of_processes(processes: Iterable[ProcessReading]) -> list[GpuJob]:
    ordered = sorted(processes, key=lambda p: (p.node, p.gpu, p.uuid, p.pid))
    return [
        GpuJob(node=p.node, gpu=p.gpu, uuid=p.uuid, job_id=p.job_id, user=p.user)
        for p in ordered
        if p.job_id is not None
    ]


def _merge_jobs(jobs: Iterable[GpuJob]) -> tuple[GpuJob, ...]:
    """One record per (GPU UUID, job id), the first seen winning but taking a user from a later one if it has none."""
    merged: dict[tuple[str, str], GpuJob] = {}
    for job in jobs:
        key = (job.uuid, job.job_id)
        known = merged.get(key)
        if known is None:
            merged[key] = job
        elif known.user is None and job.user is not None:
            merged[key] = dataclasses.replace(known, user=job.user)
    return tuple(sorted(merged.values(), key=lambda j: (j.node, j.gpu, j.uuid, j.job_id)))
