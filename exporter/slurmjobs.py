"""Slurm job metadata: the name, user, account, partition, array and times of the jobs holding the node's GPUs.

A collection never waits on Slurm. :meth:`SlurmJobInfo.enrich` only reads a cache and names the job ids it lacks; a
worker thread asks ``squeue --json`` for them (one subprocess with a timeout) and fills the cache. Slurm absent, slow
or failing is counted by reason (``slurm_*``), logged once and retried after ``retry_s``; the readings pass on
without the metadata. The cache holds at most ``max_jobs`` jobs, those seen most recently.

squeue's output is input too: it is read as it streams, and a squeue that prints more than ``MAX_OUTPUT_BYTES`` is
stopped there (``slurm_squeue_malformed``), so the exporter never holds more. A document squeue could not have meant
(a number such as ``1e400``, nesting past the parser's depth) is the same malformed answer, retried after
``retry_s`` like any failure. Text values (name, user, account, partition) are cut to the label-value length the
collector accepts (``promtext.DEFAULT_LIMITS``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import select
import subprocess
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gpulens.logutil import ErrorCounter
from gpulens.model import JobInfo, NodeSnapshot
from gpulens.promtext import DEFAULT_LIMITS

logger = logging.getLogger(__name__)

SQUEUE_MISSING: Final = "slurm_squeue_missing"
SQUEUE_FAILED: Final = "slurm_squeue_failed"
SQUEUE_TIMEOUT: Final = "slurm_squeue_timeout"
SQUEUE_MALFORMED: Final = "slurm_squeue_malformed"

MAX_OUTPUT_BYTES: Final = 16 * 1024 * 1024  # squeue --json of 500 jobs (one call) is well under 10 MiB
_READ_BYTES: Final = 1 << 16
_MAX_TEXT: Final = DEFAULT_LIMITS.label_value_length
_MAX_IDS_PER_CALL: Final = 500
# What squeue accepts: job ids, array tasks ``123_4`` and heterogeneous components ``123+0``. Other ids (a pod, a
# container, a simulated job) are never Slurm's.
_SLURM_JOB_ID: Final = re.compile(r"[0-9]{1,12}(?:_[0-9]{1,9}|\+[0-9]{1,4})?")

Runner = Callable[[Sequence[str], float], bytes]


class SlurmQueryError(Exception):
    """``squeue`` could not be run or answered badly; ``reason`` is the counter it goes to."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def run_command(argv: Sequence[str], timeout_s: float, max_bytes: int = MAX_OUTPUT_BYTES) -> bytes:
    """The standard output of ``argv`` run with a timeout, read as it streams and stopped past ``max_bytes``.
    Raises ``SlurmQueryError``."""
    with tempfile.TemporaryFile() as errors:
        try:
            process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errors, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise SlurmQueryError(SQUEUE_MISSING, f"{argv[0]} is not installed") from None
        except OSError as exc:
            raise SlurmQueryError(SQUEUE_FAILED, f"cannot run {argv[0]}: {exc}") from None
        try:
            out = _read_capped(process, argv[0], timeout_s, max_bytes)
            code = process.wait(timeout=max(0.1, timeout_s))
        except subprocess.TimeoutExpired:
            raise SlurmQueryError(SQUEUE_TIMEOUT, f"{argv[0]} did not answer within {timeout_s:g} s") from None
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            assert process.stdout is not None
            process.stdout.close()
        if code != 0 and not out.strip():
            errors.seek(max(0, errors.seek(0, os.SEEK_END) - 4096))
            err = errors.read().decode("utf-8", errors="replace").strip().splitlines()
            raise SlurmQueryError(SQUEUE_FAILED, f"{argv[0]} exited {code}: {err[-1] if err else 'no output'}")
    return out


def _read_capped(process: subprocess.Popen[bytes], name: str, timeout_s: float, max_bytes: int) -> bytes:
    """The process's standard output until it closes it; at most ``max_bytes`` are ever held."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    deadline = time.monotonic() + timeout_s
    out = bytearray()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise subprocess.TimeoutExpired(name, timeout_s)
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, _READ_BYTES)
        if not chunk:
            return bytes(out)
        if len(out) + len(chunk) > max_bytes:
            raise SlurmQueryError(SQUEUE_MALFORMED, f"{name} printed more than {max_bytes >> 20} MiB: not read further")
        out += chunk


def _number(value: Any) -> int | None:
    """Slurm's JSON numbers: a plain number (22.05) or ``{"set": bool, "infinite": bool, "number": n}`` (23.02+)."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None  # 1e400 parses as inf: no time or id squeue meant
    return int(value)


def _text(value: Any) -> str | None:
    return value[:_MAX_TEXT] if isinstance(value, str) and value and value != "(null)" else None


def parse_squeue_json(body: bytes, node: str) -> dict[str, JobInfo]:
    """Job id -> metadata from ``squeue --json``. Raises ``SlurmQueryError`` on a document of another shape."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise SlurmQueryError(SQUEUE_MALFORMED, f"squeue --json printed no JSON document: {exc}") from None
    jobs = doc.get("jobs") if isinstance(doc, dict) else None
    if not isinstance(jobs, list):
        raise SlurmQueryError(SQUEUE_MALFORMED, "squeue --json printed no 'jobs' list")
    found: dict[str, JobInfo] = {}
    for job in jobs:
        job_id = _number(job.get("job_id")) if isinstance(job, dict) else None
        if job_id is None:
            continue
        array_job = _number(job.get("array_job_id"))
        submit, start = _number(job.get("submit_time")), _number(job.get("start_time"))
        found[str(job_id)[:32]] = JobInfo(
            node=node,
            job_id=str(job_id)[:32],
            name=_text(job.get("name")),
            user=_text(job.get("user_name")),
            account=_text(job.get("account")),
            partition=_text(job.get("partition")),
            array_job_id=str(array_job) if array_job else None,
            array_task_id=_number(job.get("array_task_id")) if array_job else None,
            submit_time=float(submit) if submit else None,
            start_time=float(start) if start else None,
        )
    return found


@dataclass(slots=True)
class _Entry:
    info: JobInfo | None  # None: asked, not found (yet)
    asked_at: float


class SlurmJobInfo:
    """An enricher that adds ``job_info`` to snapshots from a cache that a worker fills with ``squeue --json``.

    ``run`` runs a command with a timeout and returns its output (raising ``SlurmQueryError``); ``clock`` is
    monotonic seconds. A job is asked for when first seen, again ``refresh_s`` later while it still holds a GPU, and
    ``retry_s`` after a failed or empty answer. ``worker`` false starts no thread: the owner calls :meth:`refresh`.
    """

    def __init__(
        self,
        *,
        squeue: str = "squeue",
        timeout_s: float = 10.0,
        refresh_s: float = 300.0,
        retry_s: float = 30.0,
        max_jobs: int = 4096,
        run: Runner = run_command,
        clock: Callable[[], float] = time.monotonic,
        worker: bool = True,
    ) -> None:
        self._squeue = squeue
        self._timeout_s = timeout_s
        self._refresh_s = refresh_s
        self._retry_s = retry_s
        self._max_jobs = max_jobs
        self._run = run
        self._clock = clock
        self._errors = ErrorCounter(logger)
        self._cache: OrderedDict[str, _Entry] = OrderedDict()
        self._wanted: dict[str, str] = {}  # job id -> node
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._stopped = not worker  # without a worker, refresh() is called by the owner (tests)
        self._thread: threading.Thread | None = None
        self.queries = 0  # squeue calls made (tests bound the work with it)

    @property
    def errors(self) -> Mapping[str, int]:
        return self._errors.snapshot()

    def enrich(self, snapshot: NodeSnapshot) -> NodeSnapshot:
        """The snapshot with the cached metadata of its jobs; the jobs not cached (or stale) are asked for later."""
        ids = sorted({job.job_id for job in snapshot.jobs if _SLURM_JOB_ID.fullmatch(job.job_id)})
        now = self._clock()
        infos: list[JobInfo] = []
        with self._lock:
            for job_id in ids:
                entry = self._cache.get(job_id)
                if entry is not None:
                    self._cache.move_to_end(job_id)
                    if entry.info is not None:
                        infos.append(_on(entry.info, snapshot.node))
                wait = self._retry_s if entry is None or entry.info is None else self._refresh_s
                if (entry is None and job_id not in self._wanted) or (
                    entry is not None and now - entry.asked_at >= wait
                ):
                    self._wanted[job_id] = snapshot.node
            if self._wanted:
                self._ensure_worker()
                self._wake.notify()
        errors = {**snapshot.errors, **self._errors.snapshot()}
        users = {info.job_id: info.user for info in infos if info.user}
        jobs = tuple(
            dataclasses.replace(job, user=users[job.job_id]) if job.user is None and job.job_id in users else job
            for job in snapshot.jobs
        )
        return snapshot.replace(jobs=jobs, job_info=tuple(infos), errors=errors)

    def refresh(self) -> None:
        """Ask Slurm for the wanted jobs now, on the calling thread (the worker's step; tests call it directly)."""
        with self._lock:
            items = list(self._wanted.items())
            wanted, self._wanted = dict(items[:_MAX_IDS_PER_CALL]), dict(items[_MAX_IDS_PER_CALL:])
        if not wanted:
            return
        argv = [self._squeue, "--json", "--jobs=" + ",".join(wanted)]
        self.queries += 1
        try:
            found = parse_squeue_json(self._run(argv, self._timeout_s), "")
        except SlurmQueryError as exc:
            self._errors.count(exc.reason, "job metadata from Slurm is missing: %s (retried)", exc)
            found = {}
        except Exception as exc:  # noqa: BLE001 -- any answer it cannot read is malformed; asked again after retry_s
            self._errors.count(SQUEUE_MALFORMED, "squeue's answer could not be read: %s (retried)", exc)
            found = {}
        now = self._clock()
        with self._lock:
            for job_id, node in wanted.items():
                info = found.get(job_id)
                self._cache[job_id] = _Entry(None if info is None else _on(info, node), now)
                self._cache.move_to_end(job_id)
            while len(self._cache) > self._max_jobs:
                self._cache.popitem(last=False)

    def close(self) -> None:
        with self._lock:
            self._stopped = True
            self._wake.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=self._timeout_s + 1)

    def _ensure_worker(self) -> None:
        """Start the worker on first need. Callers hold the lock."""
        if self._thread is None and not self._stopped:
            self._thread = threading.Thread(target=self._work, name="gpulens-slurm-jobs", daemon=True)
            self._thread.start()

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._wanted and not self._stopped:
                    self._wake.wait()
                if self._stopped:
                    return
            try:
                self.refresh()
            except Exception:  # the worker must outlive any bug; the collection goes on without metadata
                logger.exception("job metadata worker failed; retrying")
                self._errors.count(SQUEUE_FAILED)


def _on(info: JobInfo, node: str) -> JobInfo:
    return info if info.node == node else dataclasses.replace(info, node=node)
