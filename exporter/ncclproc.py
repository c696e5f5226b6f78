"""What a rank's process did between two collections: its storage I/O and CPU rates, read from ``/proc``.

For each pid asked it reads exactly two files of ``<proc_root>/<pid>``: ``io`` (only ``read_bytes`` and
``write_bytes``, the bytes the process made the block layer fetch and send: a checkpoint's write, not its socket
traffic, which ``rchar``/``wchar`` would count) and ``stat`` (``utime`` + ``stime``, and the start time that tells a
new process of the same pid). Never ``environ`` or ``cmdline``. A rate needs two readings of the same process, so a
process's first collection reads ``None``; so does a file that cannot be read (``io`` needs the agent to run as root
or as the job's user), counted once per reason and never fatal. The state kept is the last reading of each pid asked,
forgotten as soon as a pid is not asked again.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from gpulens.exporter.ncclbusy import RankActivity
from gpulens.logutil import ErrorCounter

log = logging.getLogger(__name__)

UNREADABLE: Final = "nccl_proc_unreadable"
MALFORMED: Final = "nccl_proc_malformed"
_MAX_READ_BYTES: Final = 4096  # both files are a few hundred bytes
_UTIME_INDEX: Final = 11  # field 14 of /proc/<pid>/stat, counted from field 3 (the first after "comm)")
_STIME_INDEX: Final = 12
_STARTTIME_INDEX: Final = 19
_IO_FIELDS: Final = (b"read_bytes", b"write_bytes")


@dataclass(frozen=True, slots=True)
class _Reading:
    at: float
    start: int  # the process's start time (clock ticks since boot): with the pid, one process
    io_bytes: int | None
    cpu_ticks: int


class ProcessActivity:
    """Reads ``io`` and ``stat`` of the pids asked, and their rates since the previous call."""

    def __init__(self, proc_root: str | Path = "/proc", *, ticks_per_second: float | None = None) -> None:
        self._root = Path(proc_root)
        self._hz = ticks_per_second or float(os.sysconf("SC_CLK_TCK"))
        self._last: dict[int, _Reading] = {}
        self.errors = ErrorCounter(log)

    def read(self, pids: Iterable[int], now: float) -> dict[int, RankActivity]:
        """pid -> its activity since the previous call that asked for it (``None`` fields where unknown)."""
        out: dict[int, RankActivity] = {}
        last: dict[int, _Reading] = {}
        for pid in set(pids):
            reading = self._read(pid, now)
            if reading is None:
                continue
            last[pid] = reading
            before = self._last.get(pid)
            seconds = reading.at - before.at if before is not None else 0.0
            if before is None or before.start != reading.start or seconds <= 0:
                out[pid] = RankActivity()
                continue
            io = None
            if reading.io_bytes is not None and before.io_bytes is not None:
                io = max(0, reading.io_bytes - before.io_bytes) / seconds
            cpu = max(0, reading.cpu_ticks - before.cpu_ticks) / self._hz / seconds
            out[pid] = RankActivity(io_bytes_per_second=io, cpu_cores=cpu)
        self._last = last
        return out

    def _read(self, pid: int, now: float) -> _Reading | None:
        directory = self._root / str(pid)
        stat = self._file(directory / "stat")
        if stat is None:
            return None
        fields = stat.rpartition(b")")[2].split()
        try:
            utime, stime, start = (int(fields[i]) for i in (_UTIME_INDEX, _STIME_INDEX, _STARTTIME_INDEX))
        except (IndexError, ValueError):
            self.errors.count(MALFORMED, "malformed %s: no utime, stime or start time", directory / "stat")
            return None
        return _Reading(now, start, self._io_bytes(directory / "io"), utime + stime)

    def _io_bytes(self, path: Path) -> int | None:
        text = self._file(path)
        if text is None:
            return None
        values: dict[bytes, int] = {}
        for line in text.splitlines():
            key, _, value = line.partition(b":")
            if key in _IO_FIELDS:
                try:
                    values[key] = int(value)
                except ValueError:
                    break
        if len(values) < len(_IO_FIELDS):
            self.errors.count(MALFORMED, "malformed %s: no read_bytes and write_bytes", path)
            return None
        return sum(values.values())

    def _file(self, path: Path) -> bytes | None:
        try:
            with path.open("rb") as f:
                return f.read(_MAX_READ_BYTES)
        except FileNotFoundError:
            return None  # the process exited: nothing to judge
        except OSError as exc:
            self.errors.count(UNREADABLE, "cannot read %s: %s", path, exc.strerror or type(exc).__name__)
            return None
