"""Host and job CPU and memory: the node's from ``/proc``, each job's from its control group.

* Node CPU: the aggregate ``cpu`` line of ``<proc_root>/stat`` (clock ticks: user nice system idle iowait irq
  softirq steal; guest time is already inside user and nice). Busy is everything but idle and iowait; the ratios
  are deltas between two reads, so the first read gives ``None``. ``cpus`` counts the ``cpuN`` lines.
* Node memory: ``MemTotal`` and ``MemAvailable`` of ``<proc_root>/meminfo`` (kB, i.e. KiB); used = total - available.
* Job CPU and memory: the job's cgroup, found from one of its processes' ``<proc_root>/<pid>/cgroup`` (the same
  job-id rules as the GPU process mapping, ``exporter.jobmap.job_id_from_cgroup_paths``). The job's directory is the
  cgroup path cut at the component naming the job (``.../job_4242``, ``...-pod<uid>.slice``), so every step and
  task of the job is inside it. cgroup v2 (``<cgroup_root>/cgroup.controllers`` exists): ``cpu.stat`` usage_usec,
  ``cpu.max``, ``memory.current``, ``memory.max``. cgroup v1: ``cpuacct.usage`` (ns), ``cpu.cfs_quota_us`` /
  ``cpu.cfs_period_us``, ``memory.usage_in_bytes``, ``memory.limit_in_bytes`` under the controllers' mount
  directories (``<cgroup_root>/cpu,cpuacct/...``, ``<cgroup_root>/memory/...``).

A job's ``cpu_used_cores`` is the rate of its ``cpu_seconds_total`` since the previous read of the same job and
cgroup, by the injected clock's monotonic time (``gpulens.counters.counter_rate``): ``None`` on the first read and
after the counter went down (a new cgroup under the same job id).

A process's ``environ`` and ``cmdline`` are never opened. Nothing here raises; failures are counted in ``errors``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from gpulens.clock import Clock, SystemClock
from gpulens.counters import counter_rate
from gpulens.exporter.fabric.sysread import AttributeReader
from gpulens.exporter.jobmap import job_id_from_cgroup_paths
from gpulens.fabricmodel import HostReading, JobHostReading
from gpulens.logutil import ErrorCounter

logger = logging.getLogger(__name__)

_KIB: Final = 1024
_USEC_PER_SECOND: Final = 1e6
_NSEC_PER_SECOND: Final = 1e9
_CPU_FIELDS: Final = 8  # user nice system idle iowait irq softirq steal
_IDLE: Final = 3
_IOWAIT: Final = 4
_V1_UNLIMITED: Final = 1 << 62  # v1 reports "no limit" as PAGE_COUNTER_MAX pages in bytes (0x7FFFFFFFFFFFF000)


@dataclass(frozen=True, slots=True)
class CpuTimes:
    """The aggregate CPU line of ``/proc/stat``: total, idle (idle + iowait) and iowait ticks, and the CPU count."""

    total: int
    idle: int
    iowait: int
    cpus: int


def parse_proc_stat(text: str) -> CpuTimes | None:
    """The ``cpu`` line and the number of ``cpuN`` lines; ``None`` when there is no well-formed ``cpu`` line."""
    times: list[int] | None = None
    cpus = 0
    for line in text.splitlines():
        if not line.startswith("cpu"):
            continue
        name, _, rest = line.partition(" ")
        if name == "cpu":
            fields = rest.split()[:_CPU_FIELDS]
            if len(fields) < _IOWAIT + 1 or not all(f.isdigit() for f in fields):
                return None
            times = [int(f) for f in fields]
        elif name[3:].isdigit():
            cpus += 1
    if times is None:
        return None
    return CpuTimes(total=sum(times), idle=times[_IDLE] + times[_IOWAIT], iowait=times[_IOWAIT], cpus=cpus)


def cpu_ratios(before: CpuTimes, after: CpuTimes) -> tuple[float, float] | None:
    """(busy, iowait) shares of the CPU time between two samples, each clamped to 0-1; ``None`` if none elapsed.

    Per-CPU iowait may step backwards on tickless kernels, so a negative delta counts as zero.
    """
    elapsed = after.total - before.total
    if elapsed <= 0:
        return None
    busy = (elapsed - (after.idle - before.idle)) / elapsed
    iowait = (after.iowait - before.iowait) / elapsed
    return min(max(busy, 0.0), 1.0), min(max(iowait, 0.0), 1.0)


def parse_meminfo(text: str) -> dict[str, int]:
    """``Key: <n> kB`` lines as bytes (lines without a unit, such as HugePages counts, as plain numbers)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            out[key.strip()] = int(fields[0]) * (_KIB if fields[1:] == ["kB"] else 1)
    return out


class HostReader:
    """Reads the node's CPU ratios and memory; ``proc_root`` is the host's ``/proc``."""

    def __init__(self, node: str, *, proc_root: str = "/proc", reader: AttributeReader | None = None) -> None:
        self.node = node
        self._proc_root = proc_root
        self._reader = reader if reader is not None else AttributeReader("host", ErrorCounter(logger))
        self._previous: CpuTimes | None = None

    @property
    def errors(self) -> Mapping[str, int]:
        return self._reader.errors

    def read(self) -> HostReading:
        stat_path = os.path.join(self._proc_root, "stat")
        stat_text = self._reader.text(stat_path, missing_ok=False)
        times = None if stat_text is None else parse_proc_stat(stat_text)
        if stat_text is not None and times is None:
            self._reader.malformed(stat_path, "a 'cpu <user> <nice> <system> <idle> <iowait> ...' line")
        ratios = None
        if times is not None and self._previous is not None:
            ratios = cpu_ratios(self._previous, times)
        if times is not None:
            self._previous = times
        memory = self._memory()
        total, available = memory.get("MemTotal"), memory.get("MemAvailable")
        used = None if total is None or available is None else max(total - available, 0)
        return HostReading(
            node=self.node,
            cpus=None if times is None or times.cpus == 0 else times.cpus,
            cpu_busy_ratio=None if ratios is None else ratios[0],
            cpu_iowait_ratio=None if ratios is None else ratios[1],
            memory_total_bytes=total,
            memory_used_bytes=used,
            memory_available_bytes=available,
        )

    def _memory(self) -> dict[str, int]:
        path = os.path.join(self._proc_root, "meminfo")
        text = self._reader.text(path, missing_ok=False)
        if text is None:
            return {}
        memory = parse_meminfo(text)
        if "MemTotal" not in memory:
            self._reader.malformed(path, "a 'MemTotal: <n> kB' line")
        return memory


def parse_cgroup_file(text: str) -> list[tuple[str, tuple[str, ...], str]] | None:
    """``/proc/<pid>/cgroup`` lines as (hierarchy id, controllers, path); ``None`` if any line is not of that form.

    The same ``id:controllers:/path`` format ``exporter.jobmap`` checks; kept here as a three-field split because the
    job mapper's parser returns only the job id, and this reader also needs each hierarchy's path and controllers.
    """
    entries = []
    for line in text.splitlines():
        if not line.strip():
            continue
        hierarchy, sep1, rest = line.partition(":")
        controllers, sep2, path = rest.partition(":")
        if not (sep1 and sep2 and hierarchy.isdigit() and path.startswith("/")):
            return None
        entries.append((hierarchy, tuple(c for c in controllers.split(",") if c), path))
    return entries or None


def job_cgroup(path: str, job_id: str) -> str | None:
    """The ancestor of the cgroup ``path`` that names ``job_id``: the shortest prefix the job-id rules map to it.

    ``/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0`` gives ``/system.slice/slurmstepd.scope/job_4242``.
    """
    parts = path.split("/")
    for end in range(2, len(parts) + 1):
        prefix = "/".join(parts[:end])
        if job_id_from_cgroup_paths([prefix]) == job_id:
            return prefix
    return None


class JobHostReader:
    """Reads each job's CPU time, CPU limit and memory from its cgroup, given the pids of its processes.

    ``proc_root`` is the host's ``/proc``; ``cgroup_root`` where the cgroup hierarchies are mounted
    (``/sys/fs/cgroup``). One reading per job, however many of its pids are given; pids outside any job are skipped.
    """

    def __init__(
        self,
        node: str,
        *,
        proc_root: str = "/proc",
        cgroup_root: str = "/sys/fs/cgroup",
        reader: AttributeReader | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.node = node
        self._proc_root = proc_root
        self._cgroup_root = cgroup_root
        self._reader = reader if reader is not None else AttributeReader("host", ErrorCounter(logger))
        self._clock = clock if clock is not None else SystemClock()
        self._unified: bool | None = None
        self._previous: dict[tuple[str, str | None], tuple[float, float | None]] = {}

    @property
    def errors(self) -> Mapping[str, int]:
        return self._reader.errors

    @property
    def unified(self) -> bool:
        """Whether the cgroup root is a v2 (unified) hierarchy; decided on first use."""
        if self._unified is None:
            self._unified = os.path.exists(os.path.join(self._cgroup_root, "cgroup.controllers"))
        return self._unified

    def read(self, pids: Iterable[int]) -> tuple[JobHostReading, ...]:
        """One reading per job among ``pids``' processes, ordered by job id, with ``cpu_used_cores`` filled in."""
        now = self._clock.monotonic()
        jobs: dict[str, JobHostReading] = {}
        for pid in pids:
            found = self._job_of(pid)
            if found is not None and found[0] not in jobs:
                job_id, entries = found
                reading = self._read_v2(job_id, entries) if self.unified else self._read_v1(job_id, entries)
                if reading is not None:
                    jobs[job_id] = reading
        previous, self._previous = self._previous, {}  # a job no longer seen is forgotten
        out = []
        for job_id in sorted(jobs):
            reading = jobs[job_id]
            key = (job_id, reading.cgroup)
            before = previous.get(key)
            self._previous[key] = (now, reading.cpu_seconds_total)
            if before is not None:
                cores = counter_rate(before[1], reading.cpu_seconds_total, now - before[0])
                reading = dataclasses.replace(reading, cpu_used_cores=cores)
            out.append(reading)
        return tuple(out)

    def _job_of(self, pid: int) -> tuple[str, list[tuple[str, tuple[str, ...], str]]] | None:
        path = os.path.join(self._proc_root, str(pid), "cgroup")
        text = self._reader.text(path)  # missing: the process has exited, which is no error
        if text is None:
            return None
        entries = parse_cgroup_file(text)
        if entries is None:
            self._reader.malformed(path, "'id:controllers:/path' lines")
            return None
        job_id = job_id_from_cgroup_paths(path for _, _, path in entries)
        return None if job_id is None else (job_id, entries)

    def _read_v2(self, job_id: str, entries: list[tuple[str, tuple[str, ...], str]]) -> JobHostReading | None:
        unified = next((path for hierarchy, _, path in entries if hierarchy == "0"), None)
        cgroup = None if unified is None else job_cgroup(unified, job_id)
        if cgroup is None:
            return None
        directory = self._cgroup_root + cgroup
        usage = self._keyed(os.path.join(directory, "cpu.stat"), "usage_usec")
        return JobHostReading(
            node=self.node,
            job_id=job_id,
            cgroup=cgroup,
            cgroup_version=2,
            cpu_seconds_total=None if usage is None else usage / _USEC_PER_SECOND,
            cpu_limit_cores=self._cpu_max(os.path.join(directory, "cpu.max")),
            memory_used_bytes=self._reader.integer(os.path.join(directory, "memory.current")),
            memory_limit_bytes=self._limit(os.path.join(directory, "memory.max")),
        )

    def _read_v1(self, job_id: str, entries: list[tuple[str, tuple[str, ...], str]]) -> JobHostReading | None:
        dirs: dict[str, str] = {}
        cgroup = None
        for _, controllers, path in entries:
            job_path = job_cgroup(path, job_id)
            if job_path is None or not controllers:
                continue
            for controller in controllers:
                dirs[controller] = os.path.join(self._cgroup_root, ",".join(controllers)) + job_path
            if "cpuacct" in controllers or cgroup is None:
                cgroup = job_path
        if not dirs:
            return None
        usage = self._v1_value(dirs, "cpuacct", "cpuacct.usage")
        quota = self._v1_value(dirs, "cpu", "cpu.cfs_quota_us", signed=True)
        period = self._v1_value(dirs, "cpu", "cpu.cfs_period_us")
        limit = self._v1_value(dirs, "memory", "memory.limit_in_bytes")
        return JobHostReading(
            node=self.node,
            job_id=job_id,
            cgroup=cgroup,
            cgroup_version=1,
            cpu_seconds_total=None if usage is None else usage / _NSEC_PER_SECOND,
            cpu_limit_cores=None if quota is None or quota < 0 or not period else quota / period,
            memory_used_bytes=self._v1_value(dirs, "memory", "memory.usage_in_bytes"),
            memory_limit_bytes=None if limit is None or limit >= _V1_UNLIMITED else limit,
        )

    def _v1_value(self, dirs: Mapping[str, str], controller: str, name: str, *, signed: bool = False) -> int | None:
        directory = dirs.get(controller)
        return None if directory is None else self._reader.integer(os.path.join(directory, name), signed=signed)

    def _keyed(self, path: str, key: str) -> int | None:
        """The value of one ``<key> <n>`` line of a flat-keyed file such as ``cpu.stat``."""
        text = self._reader.text(path)
        if text is None:
            return None
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                if value.strip().isdigit():
                    return int(value)
                break
        self._reader.malformed(path, f"a '{key} <n>' line")
        return None

    def _cpu_max(self, path: str) -> float | None:
        """``cpu.max`` is ``<quota> <period>`` in microseconds, or ``max <period>`` when unlimited."""
        text = self._reader.text(path)
        if text is None:
            return None
        fields = text.split()
        if len(fields) == 2 and fields[1].isdigit() and int(fields[1]) > 0:
            if fields[0] == "max":
                return None
            if fields[0].isdigit():
                return int(fields[0]) / int(fields[1])
        self._reader.malformed(path, "'<quota> <period>' or 'max <period>'")
        return None

    def _limit(self, path: str) -> int | None:
        """``memory.max``: bytes, or ``max`` for no limit."""
        text = self._reader.text(path)
        if text is None or text == "max":
            return None
        if text.isdigit():
            return int(text)
        self._reader.malformed(path, "a number of bytes or 'max'")
        return None
