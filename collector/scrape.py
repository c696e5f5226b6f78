"""One scrape of one target: fetch over HTTP(S) with keep-alive, parse, and reject bad samples one by one.

A target that hangs, refuses, answers 500 or garbage costs at most its own timeout and never raises: the result
carries the target's health (up, error, duration, samples) and the per-reason counts of what was rejected.

A gpulens exporter is asked for the columnar snapshot with only the inactive links (``?layout=columnar&links=inactive``,
docs/snapshot.md); an older exporter ignores the parameters and serves the row layout with every link, which the
document names and the codec reads just the same.

``kind = "dcgm"`` targets are converted by ``gpulens.dcgmnode.DcgmPageReader``, the same converter the exporter's
``dcgm`` source uses; the scraper keeps one reader per target (keyed by target name, replaced when the target's URL
or node changes), which remembers the GPUs seen (a vanished GPU is reported down) and counts XIDs. That memory is
not persisted: restarting the collector forgets a lost GPU (or ``Scraper.forget_gpu``).
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import http.client
import logging
import math
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from operator import attrgetter, is_not
from typing import Final
from urllib.parse import urlsplit

from collector.targets import Target
from gpulens.clock import Clock, SystemClock
from gpulens.config import ConfigError
from gpulens.dcgmnode import DcgmPageError, DcgmPageReader
from gpulens.httpfetch import Deadline, DeadlineHTTPConnection, DeadlineHTTPSConnection, read_body, redact_url
from gpulens.model import LINKS_INACTIVE, GpuReading, NodeSnapshot, SnapshotFormatError, TargetHealth
from gpulens.snapshotcodec import LAYOUT_COLUMNAR, SnapshotNotJSONError, snapshot_from_bytes

log = logging.getLogger(__name__)

_RATIO_FIELDS: Final = ("utilization_ratio", "sm_active_ratio", "tensor_active_ratio", "dram_active_ratio")
_NON_NEGATIVE: Final = tuple(
    f.name
    for f in dataclasses.fields(GpuReading)
    if str(f.type) in ("int | None", "float | None") and f.name not in ("gpu", "timestamp")
)
_TEMPERATURES: Final = ("temperature_celsius", "memory_temperature_celsius")
# The checks read many fields of 8,000 readings a round: fetch them with C getters, skip the unknowns (None) in C.
_non_negative = attrgetter(*_NON_NEGATIVE)
_ratios = attrgetter(*_RATIO_FIELDS)
_temperatures = attrgetter(*_TEMPERATURES)
_known = functools.partial(is_not, None)
# Query asking a gpulens exporter for the columnar snapshot with only the inactive links (the collector stores link
# outages, and each GPU's NVLink totals are in its reading): older exporters ignore what they do not know.
SNAPSHOT_QUERY = f"layout={LAYOUT_COLUMNAR}&links={LINKS_INACTIVE}"


class ScrapeError(Exception):
    """The target could not be scraped; the message is safe to store and show (no credentials)."""


@dataclass
class ScrapeResult:
    target: Target
    health: TargetHealth
    snapshot: NodeSnapshot | None = None
    rejected: dict[str, int] = field(default_factory=dict)


def _reject_reason(g: GpuReading, now: float, future_tolerance_s: float) -> str | None:
    """Why a reading is absurd, or None when it is plausible."""
    if not math.isfinite(g.timestamp) or g.timestamp > now + future_tolerance_s:
        return "future_timestamp"
    if min(filter(_known, _non_negative(g)), default=0) < 0:
        return "negative_value"
    if max(filter(_known, _ratios(g)), default=0) > 1.0:
        return "ratio_above_one"
    used, total = g.memory_used_bytes, g.memory_total_bytes
    if used is not None and total is not None and used > total * 1.05:
        return "memory_above_total"
    if max(filter(_known, _temperatures(g)), default=0) > 250:
        return "absurd_temperature"
    if g.power_watts is not None and g.power_watts > 20_000:
        return "absurd_power"
    return None


def sanitize(snapshot: NodeSnapshot, now: float, future_tolerance_s: float) -> tuple[NodeSnapshot, dict[str, int]]:
    """Drop the readings that cannot be true (and duplicate GPUs), counting each by reason."""
    rejected: dict[str, int] = {}
    kept: list[GpuReading] = []
    seen: set[str] = set()
    for g in snapshot.gpus:
        reason = "duplicate_gpu" if g.uuid in seen else _reject_reason(g, now, future_tolerance_s)
        if reason is None and g.node != snapshot.node:
            reason = "node_mismatch"
        if reason is not None:
            rejected[reason] = rejected.get(reason, 0) + 1
            continue
        seen.add(g.uuid)
        kept.append(g)
    if not rejected:
        return snapshot, rejected
    keep = {g.uuid for g in kept}
    return (
        snapshot.replace(
            gpus=tuple(kept),
            links=tuple(x for x in snapshot.links if x.uuid in keep),
            processes=tuple(x for x in snapshot.processes if x.uuid in keep),
            jobs=tuple(x for x in snapshot.jobs if x.uuid in keep),
            migs=tuple(x for x in snapshot.migs if x.uuid in keep),
        ),
        rejected,
    )


class _Connections(threading.local):
    def __init__(self) -> None:
        self.pool: dict[tuple[str, str, int], DeadlineHTTPConnection] = {}


class Scraper:
    """Scrapes targets with per-thread keep-alive connections; safe to call from many threads."""

    def __init__(
        self,
        *,
        timeout_s: float = 5.0,
        max_bytes: int = 16 * 1024 * 1024,
        future_tolerance_s: float = 300.0,
        clock: Clock | None = None,
    ) -> None:
        self._timeout = timeout_s
        self._max_bytes = max_bytes
        self._future = future_tolerance_s
        self._clock = clock or SystemClock()
        self._local = _Connections()
        self._contexts: dict[tuple[str | None, bool], ssl.SSLContext] = {}
        self._lock = threading.Lock()
        self._all: set[http.client.HTTPConnection] = set()  # every thread's connections, for close()
        self._readers: dict[str, DcgmPageReader] = {}  # dcgm targets by name: what each page needs from the last
        self._inflight: set[Deadline] = set()  # the requests running now, for abort()
        self.aborted = False

    def abort(self) -> None:
        """Cut every request in flight short, and refuse new ones (shutdown): a dripping target cannot hold it."""
        with self._lock:
            self.aborted = True
            running = list(self._inflight)
        for deadline in running:
            deadline.cancel()

    def _reader(self, target: Target) -> DcgmPageReader:
        with self._lock:
            reader = self._readers.get(target.name)
            if reader is None or (reader.url, reader.configured_node) != (target.url, target.node):
                # Last resort for the node name: a loopback URL with no usable label is this machine.
                reader = DcgmPageReader(
                    target.url, node=target.node, fallback_node=socket.gethostname(), label=f"target {target.name}"
                )
                self._readers[target.name] = reader
            return reader

    def forget_gpu(self, uuid: str) -> bool:
        """Stop reporting a vanished GPU as down, on whichever target saw it. True when one knew it."""
        with self._lock:
            readers = list(self._readers.values())
        return any([reader.forget(uuid) for reader in readers])

    def scrape(self, target: Target) -> ScrapeResult:
        started = time.perf_counter()
        now = self._clock.now()
        url = target.scrape_url
        try:
            body = self._get(target, url)
            snapshot, rejected = self._parse(target, body, now)
        except ScrapeError as exc:
            health = TargetHealth(
                target=target.name,
                url=redact_url(url),
                kind=target.kind,
                timestamp=now,
                up=False,
                node=target.node,
                scrape_duration_seconds=time.perf_counter() - started,
                last_error=str(exc),
            )
            return ScrapeResult(target, health)
        health = TargetHealth(
            target=target.name,
            url=redact_url(url),
            kind=target.kind,
            timestamp=now,
            up=True,
            node=snapshot.node,
            scrape_duration_seconds=time.perf_counter() - started,
            samples=len(snapshot.gpus),
            rejected=sum(rejected.values()),
        )
        return ScrapeResult(target, health, snapshot, rejected)

    # -- parsing ----------------------------------------------------------------------------------------------------

    def _parse(self, target: Target, body: bytes, now: float) -> tuple[NodeSnapshot, dict[str, int]]:
        if target.kind == "dcgm":
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError:
                raise ScrapeError("the response is not UTF-8") from None
            try:
                result = self._reader(target).read(text, now)
            except DcgmPageError as exc:
                raise ScrapeError(str(exc)) from None
            snapshot, rejected = sanitize(result.snapshot, now, self._future)
            merge_counts(rejected, result.problems)
            return snapshot, rejected
        try:
            snapshot = snapshot_from_bytes(body)
        except SnapshotNotJSONError as exc:
            raise ScrapeError(f"the response is not JSON ({exc})") from None
        except SnapshotFormatError as exc:
            raise ScrapeError(f"the snapshot is malformed: {exc}") from None
        if snapshot.timestamp > now + self._future:
            raise ScrapeError("the snapshot is stamped in the future")
        return sanitize(snapshot, now, self._future)

    # -- HTTP -------------------------------------------------------------------------------------------------------

    def _context(self, target: Target) -> ssl.SSLContext:
        key = (target.auth.ca_file, target.auth.insecure_skip_verify)
        with self._lock:
            ctx = self._contexts.get(key)
            if ctx is None:
                ctx = ssl.create_default_context(cafile=target.auth.ca_file)
                if target.auth.insecure_skip_verify:
                    ctx.check_hostname = False
                    ctx.verify_mode = ssl.CERT_NONE
                self._contexts[key] = ctx
            return ctx

    def _connection(self, target: Target, scheme: str, host: str, port: int) -> DeadlineHTTPConnection:
        key = (scheme, host, port)
        conn = self._local.pool.get(key)
        if conn is None:
            if scheme == "https":
                conn = DeadlineHTTPSConnection(host, port, timeout=self._timeout, context=self._context(target))
            else:
                conn = DeadlineHTTPConnection(host, port, timeout=self._timeout)
            self._local.pool[key] = conn
            with self._lock:
                self._all.add(conn)
        return conn

    def _drop(self, scheme: str, host: str, port: int) -> None:
        conn = self._local.pool.pop((scheme, host, port), None)
        if conn is not None:
            conn.close()
            with self._lock:
                self._all.discard(conn)

    def _headers(self, target: Target) -> dict[str, str]:
        headers = {"Accept-Encoding": "gzip", "User-Agent": "gpulens-collector"}
        if target.auth.username:
            try:
                password = target.auth.password() or ""
            except ConfigError as exc:
                raise ScrapeError(str(exc)) from None
            token = base64.b64encode(f"{target.auth.username}:{password}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        return headers

    def _get(self, target: Target, url: str) -> bytes:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ScrapeError(f"not an http(s) URL: {redact_url(url)}")
        scheme, host = parts.scheme, parts.hostname
        port = parts.port or (443 if scheme == "https" else 80)
        query = parts.query
        if target.kind != "dcgm":  # a gpulens exporter: ask for the columnar layout and the inactive links
            query = f"{query}&{SNAPSHOT_QUERY}" if query else SNAPSHOT_QUERY
        path = (parts.path or "/") + (f"?{query}" if query else "")
        headers = self._headers(target)
        deadline = Deadline(self._timeout)  # one deadline for the whole request, retry included
        with self._lock:
            if self.aborted:
                raise ScrapeError("the collector is stopping")
            self._inflight.add(deadline)
        try:
            return self._get_within(target, deadline, (scheme, host, port), path, headers)
        finally:
            with self._lock:
                self._inflight.discard(deadline)

    def _get_within(
        self, target: Target, deadline: Deadline, where: tuple[str, str, int], path: str, headers: dict[str, str]
    ) -> bytes:
        scheme, host, port = where
        for attempt in (1, 2):  # a kept-alive connection the server closed gets one fresh retry
            conn = self._connection(target, scheme, host, port)
            conn.deadline = deadline
            reused = conn.sock is not None
            try:
                conn.request("GET", path, headers=headers)
                response = conn.getresponse()
                body = read_body(response, response.msg, self._max_bytes)
            except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine) as exc:
                self._drop(scheme, host, port)
                if reused and attempt == 1 and _time_left(deadline):
                    continue
                raise ScrapeError(_describe(exc)) from None
            except TimeoutError:
                self._drop(scheme, host, port)
                if deadline.cancelled:
                    raise ScrapeError("the collector is stopping") from None
                raise ScrapeError(f"timed out after {self._timeout:g}s") from None
            except (OSError, http.client.HTTPException, zlib.error, ValueError) as exc:
                self._drop(scheme, host, port)
                raise ScrapeError(_describe(exc)) from None
            if response.will_close:
                self._drop(scheme, host, port)
            if response.status != 200:
                raise ScrapeError(f"HTTP {response.status} {response.reason}".strip())
            return body
        raise ScrapeError("connection closed")  # pragma: no cover - the loop returns or raises

    def close(self) -> None:
        """Close every thread's connections (call when no scrape is running)."""
        with self._lock:
            conns, self._all = self._all, set()
        for conn in conns:
            conn.close()
        self._local.pool.clear()


def _time_left(deadline: Deadline) -> bool:
    try:
        return deadline.remaining() > 0
    except TimeoutError:
        return False


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, http.client.RemoteDisconnected):
        return "the target closed the connection without answering"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host ({exc.strerror})"
    text = str(exc) or type(exc).__name__
    return text[:200]


def merge_counts(into: dict[str, int], more: Mapping[str, int]) -> None:
    for key, value in more.items():
        into[key] = into.get(key, 0) + value
