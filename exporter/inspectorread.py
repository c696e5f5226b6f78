"""The node agent's reader of NCCL Inspector output (``--nccl-inspector-dir``): the ranks' files, tailed and summed.

The directory (and each folder directly under it, e.g. one per job: ``NCCL_INSPECTOR_DUMP_DIR=/dir/$SLURM_JOB_ID``)
holds the ranks' JSON logs (``*-pid<pid>.log``, appended to) and Prometheus files (``nccl_inspector_metrics_*.prom``,
rewritten whole). A JSON log is tailed from where it stood when the reader first saw it (a log that appears later
from its start); a Prometheus file is read whole when it changes and counts while it is younger than ``keep_s``.
Each pass is bounded: at most ``max_files`` files, ``max_bytes`` read over all of them (the rest waits for the next
pass, the files taken in turn), lines of ``MAX_LINE_BYTES``, ``MAX_SERIES`` series. A rank's job and GPU come from
its process (the pid in its JSON lines, as the job mapper found it), else the Prometheus labels and file name, else
the folder's name. A series not measured again is kept for ``keep_s``, then forgotten.

It runs as a side reader (``BackgroundEnricher``), so a slow disk never holds up a collection.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Final

from gpulens.exporter.inspectorparse import MAX_LINE_BYTES, InspectorLineError, parse_json_line, parse_prom_page
from gpulens.logutil import ErrorCounter
from gpulens.model import NodeSnapshot
from gpulens.ncclinspect import MAX_SERIES, InspectorRecord, InspectorSeries, InspectorView, series_key, summarise
from gpulens.promtext import PageDecodeError, decode_page

log = logging.getLogger(__name__)

JSON_RE: Final = re.compile(r"^.+-pid[0-9]+\.log$")
PROM_RE: Final = re.compile(r"^nccl_inspector_metrics_(?P<uuid>[A-Za-z0-9-]{1,80})\.prom$")
_JOB_DIR_RE: Final = re.compile(r"^(?:nccl-inspector-)?(?P<job>[0-9][0-9_.]{0,40})$")
MAX_PROM_BYTES: Final = 1 << 20  # a GPU's file is ~1 KiB per communicator and collective


@dataclass(slots=True)
class _Tail:
    inode: int
    offset: int
    skipping: bool = False  # inside a line over MAX_LINE_BYTES: dropped up to its line feed
    stamp: tuple[int, int] = (0, 0)  # a Prometheus file's (mtime_ns, size) when last read
    records: tuple[InspectorRecord, ...] = ()  # a Prometheus file's records
    mtime: float = 0.0


class InspectorReader:
    """Reads the Inspector's files under ``directory`` into each snapshot's ``inspector`` view."""

    def __init__(
        self,
        directory: str,
        *,
        keep_s: float = 300.0,
        max_files: int = 512,
        max_bytes: int = 8 << 20,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._dir = directory
        self._keep = keep_s
        self._max_files = max_files
        self._max_bytes = max_bytes
        self._wall = wall
        self._tails: dict[str, _Tail] = {}
        self._first = True
        self._turn = 0
        self._held: dict[tuple[str, str, str, str], tuple[InspectorSeries, float]] = {}
        self.errors = ErrorCounter(log)
        self.passes = 0

    def enrich(self, snapshot: NodeSnapshot) -> NodeSnapshot:
        view = self.read(snapshot)
        return snapshot.replace(inspector=view, errors={**snapshot.errors, **self.errors.snapshot()})

    def read(self, snapshot: NodeSnapshot) -> InspectorView:
        """One pass over the directory: the view of every series measured within ``keep_s``."""
        self.passes += 1
        now = self._wall()
        by_pid = {p.pid: (p.job_id, p.uuid) for p in snapshot.processes}
        uuids = {_bare(g.uuid): g.uuid for g in snapshot.gpus}
        try:
            files = self._files()
        except OSError as exc:
            self.errors.count("nccl_inspector_unreadable", "NCCL Inspector directory %s: %s", self._dir, exc)
            return InspectorView(files=0, records=0, error=f"cannot list {self._dir}: {exc.strerror or exc}")
        first, self._first = self._first, False
        seen = {path for path, _, _ in files}
        for gone in set(self._tails) - seen:
            del self._tails[gone]
        records: list[InspectorRecord] = []
        budget = self._max_bytes
        start = self._turn % len(files) if files else 0
        self._turn += 1
        for path, job_hint, prom_uuid in files[start:] + files[:start]:
            got: list[InspectorRecord] = []
            try:
                if prom_uuid is not None:
                    budget -= self._prom(path, uuids.get(prom_uuid.lower(), prom_uuid), got, now)
                elif budget > 0:
                    budget -= self._json(path, first, got, budget)
            except OSError as exc:
                self.errors.count("nccl_inspector_unreadable", "NCCL Inspector file %s: %s", path, exc)
            for r in got:
                if r.job_id is None or r.gpu is None:
                    job, gpu = by_pid.get(r.pid or -1, (None, None))
                    r = replace(r, job_id=r.job_id or job or job_hint, gpu=r.gpu or gpu)
                records.append(r)
        series, dropped = summarise(records, MAX_SERIES)
        for s in series:
            self._held[series_key(s)] = (s, now)
        for key, (_, at) in list(self._held.items()):
            if now - at > self._keep:
                del self._held[key]
        kept = sorted(self._held.items())[:MAX_SERIES]
        dropped += len(self._held) - len(kept)
        if dropped:
            self.errors.count("nccl_inspector_series_limit", "NCCL Inspector: over %d series, dropped", MAX_SERIES)
        return InspectorView(
            files=len(files),
            records=len(records),
            series=tuple(s for _, (s, _) in kept),
            dropped_series=dropped,
        )

    def _files(self) -> list[tuple[str, str | None, str | None]]:
        """(path, the job its folder names, the GPU UUID a Prometheus file's name gives) for each file, sorted."""
        out: list[tuple[str, str | None, str | None]] = []
        for path, name, job in self._walk():
            if len(out) >= self._max_files:
                self.errors.count("nccl_inspector_file_limit", "NCCL Inspector: over %d files", self._max_files)
                break
            prom = PROM_RE.match(name)
            if prom is not None:
                out.append((path, job, prom["uuid"]))
            elif JSON_RE.match(name):
                out.append((path, job, None))
        return sorted(out)

    def _walk(self) -> Iterator[tuple[str, str, str | None]]:
        with os.scandir(self._dir) as top:
            entries = sorted(top, key=lambda e: e.name)
        for entry in entries:
            if entry.is_file(follow_symlinks=False):
                yield entry.path, entry.name, None
            elif entry.is_dir(follow_symlinks=False):
                m = _JOB_DIR_RE.match(entry.name)
                try:
                    with os.scandir(entry.path) as sub:
                        inner = sorted((e.path, e.name) for e in sub if e.is_file(follow_symlinks=False))
                except OSError:
                    continue
                for path, name in inner:
                    yield path, name, m["job"] if m else None

    def _json(self, path: str, first: bool, out: list[InspectorRecord], budget: int) -> int:
        """Reads what was appended to a JSON log since the last pass, at most ``budget`` bytes; the bytes read."""
        st = os.stat(path)
        tail = self._tails.get(path)
        if tail is None or tail.inode != st.st_ino or st.st_size < tail.offset:
            tail = self._tails[path] = _Tail(st.st_ino, st.st_size if first and tail is None else 0)
        if st.st_size <= tail.offset:
            return 0
        with open(path, "rb") as fh:
            fh.seek(tail.offset)
            chunk = fh.read(min(budget, st.st_size - tail.offset))
        end = chunk.rfind(b"\n")
        if end < 0:  # no whole line yet: wait, unless it is already too long to be one
            if len(chunk) > MAX_LINE_BYTES:
                tail.offset += len(chunk)
                if not tail.skipping:
                    self.errors.count("nccl_inspector_bad_line", "NCCL Inspector %s: a line over the limit", path)
                tail.skipping = True
            return len(chunk)
        lines = chunk[:end].split(b"\n")
        if tail.skipping:  # the rest of a line over the limit
            lines, tail.skipping = lines[1:], False
        tail.offset += end + 1
        for line in lines:
            try:
                record = parse_json_line(line)
            except InspectorLineError as exc:
                self.errors.count("nccl_inspector_bad_line", "NCCL Inspector %s: %s (counted, skipped)", path, exc)
                continue
            if record is not None:
                out.append(record)
        return end + 1

    def _prom(self, path: str, gpu: str, out: list[InspectorRecord], now: float) -> int:
        """A Prometheus file's records, read again only when it changed; the bytes read."""
        st = os.stat(path)
        tail = self._tails.get(path)
        stamp = (st.st_mtime_ns, st.st_size)
        read = 0
        if tail is None or tail.stamp != stamp:
            tail = self._tails[path] = _Tail(st.st_ino, 0, stamp=stamp, mtime=st.st_mtime)
            if st.st_size > MAX_PROM_BYTES:
                self.errors.count("nccl_inspector_bad_line", "NCCL Inspector %s: over %d bytes", path, MAX_PROM_BYTES)
                return 0
            with open(path, "rb") as fh:
                body = fh.read(MAX_PROM_BYTES)
            read = len(body)
            try:
                page = parse_prom_page(decode_page(body), gpu)
            except PageDecodeError as exc:
                self.errors.count("nccl_inspector_bad_line", "NCCL Inspector %s: %s", path, exc)
                return read
            for _ in range(page.bad_lines + page.limit_hits):
                self.errors.count("nccl_inspector_bad_line", "NCCL Inspector %s: a bad line (counted, skipped)", path)
            tail.records = tuple(page.records)
        if now - tail.mtime <= self._keep:
            out.extend(tail.records)
        return read


def _bare(uuid: str) -> str:
    """An NVML UUID (``GPU-3c9b0f7e-...``) as the Inspector names its file (``3c9b0f7e-...``, CUDA's bytes)."""
    return uuid.lower().removeprefix("gpu-")
