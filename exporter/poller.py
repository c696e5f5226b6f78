"""Collect in the background, serve the snapshot: a scrape never waits for hardware.

A ``Poller`` reads its source every interval on its own thread, enriches the snapshot with jobs, and publishes it;
the /metrics text and the snapshot JSON are rendered at most once per collection, by the first request for them. The
source is read on its own thread (``sidereader.DeadlineWorker``) under a deadline: a read that is late (a hung
driver, a starved process) leaves the last readings in place, served marked stale with their age, and the side
readers' parts go on being refreshed. /metrics never answers 503 for a late collection; the snapshot document then
withdraws the GPU readings (the collector must not take old readings for new) and says which parts are stale. An
``OnDemandNode`` serves one node of a ``MultiNodeSource`` (the simulator's ``--all-nodes``), computing and caching per
snapshot time instead.
"""

from __future__ import annotations

import functools
import gzip
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from gpulens.clock import Clock, SystemClock
from gpulens.exporter.metrics import ExporterHealth, LastXidTracker, render_metrics
from gpulens.exporter.privacy import without_user_names
from gpulens.exporter.sidereader import DeadlineWorker, Late, ReaderState
from gpulens.logutil import ErrorCounter
from gpulens.model import LINKS_ALL, LINKS_INACTIVE, GpuSource, MultiNodeSource, NodeSnapshot, NodeUnavailableError
from gpulens.snapshotcodec import snapshot_to_bytes

log = logging.getLogger(__name__)

Enricher = Callable[[NodeSnapshot], NodeSnapshot]
GZIP_LEVEL = 1  # fast: the text compresses ~8x even so, and the CPU goes to serving
KEEP_STALE_S = 300.0  # /metrics serves the last GPU readings marked stale for this long, then withdraws them
GPUS = "gpus"  # the GPU source's name among the readers


def without_gpus(snapshot: NodeSnapshot) -> NodeSnapshot:
    """The snapshot with its GPU part withdrawn (readings, links, processes, MIG devices); jobs and the node's
    other parts stay."""
    return snapshot.replace(gpus=(), links=(), processes=(), migs=())


class Published:
    """What the HTTP endpoints serve for one collection. Each representation is rendered on first use and then
    reused until the next collection; two threads racing to render produce identical bytes."""

    def __init__(
        self,
        snapshot: NodeSnapshot | None,
        health: ExporterHealth,
        *,
        healthy: bool,
        health_doc: Mapping[str, Any],
        dcgm_compat: bool = False,
        last_xid: Mapping[str, int] | None = None,
        unavailable: bool = False,
        process_pids: bool = False,
        metrics_snapshot: NodeSnapshot | None = None,
        user_names: bool = True,
    ) -> None:
        """``user_names=False``: user and job names are withdrawn from both representations (exporter/privacy.py)."""
        if metrics_snapshot is None:
            metrics_snapshot = snapshot
        if not user_names:
            snapshot = None if snapshot is None else without_user_names(snapshot)
            metrics_snapshot = None if metrics_snapshot is None else without_user_names(metrics_snapshot)
        self.snapshot = snapshot  # the snapshot document's: a stale GPU part withdrawn
        self.metrics_snapshot = metrics_snapshot  # /metrics's
        self.health = health
        self.healthy = healthy
        self.health_doc = health_doc
        self.unavailable = unavailable  # the node answers nothing (HTTP 503 on every endpoint)
        self._dcgm_compat = dcgm_compat
        self._last_xid = last_xid
        self._process_pids = process_pids
        self._bodies: dict[tuple[str, str, bool], bytes] = {}  # (layout, links, gzipped) -> the snapshot document

    @functools.cached_property
    def metrics(self) -> bytes:
        return render_metrics(
            self.metrics_snapshot,
            self.health,
            dcgm_compat=self._dcgm_compat,
            last_xid=self._last_xid,
            process_pids=self._process_pids,
        )

    @functools.cached_property
    def metrics_gzip(self) -> bytes:
        return gzip.compress(self.metrics, compresslevel=GZIP_LEVEL)

    def snapshot_body(self, layout: str, *, gzipped: bool, links: str = LINKS_ALL) -> bytes:
        """The snapshot document in ``layout`` (``rows`` or ``columnar``) with ``links`` (``all`` or only the
        ``inactive`` ones: docs/snapshot.md), gzipped or not; each rendered once per collection."""
        return self._body(layout, links, gzipped=gzipped)

    def _body(self, layout: str, links: str, *, gzipped: bool) -> bytes:
        key = (layout, links, gzipped)
        body = self._bodies.get(key)
        if body is None:
            if gzipped:
                body = gzip.compress(self._body(layout, links, gzipped=False), compresslevel=GZIP_LEVEL)
            else:
                if self.snapshot is None:
                    raise ValueError("no current snapshot")
                snapshot = self.snapshot.inactive_links() if links == LINKS_INACTIVE else self.snapshot
                # orjson: 6x faster than json.dumps, which matters when one process serves 1,000 simulated nodes.
                body = snapshot_to_bytes(snapshot, self.health_doc, layout=layout)
            self._bodies[key] = body  # two threads racing render the same bytes: either may land
        return body


class NodeEndpoint(Protocol):
    """One node as the HTTP server sees it."""

    def published(self) -> Published: ...


class Poller:
    """Reads a source every ``interval_s`` on a background thread and publishes the rendered result."""

    def __init__(
        self,
        source: GpuSource,
        *,
        interval_s: float = 1.0,
        clock: Clock | None = None,
        enrich: Enricher | None = None,
        dcgm_compat: bool = False,
        stale_after_s: float | None = None,
        process_pids: bool = False,
        user_names: bool = True,
        read_deadline_s: float | None = None,
        keep_stale_s: float = KEEP_STALE_S,
        readers: Mapping[str, Callable[[], ReaderState]] | None = None,
    ) -> None:
        """``read_deadline_s``: how long a collection waits for the source (default: ``stale_after_s``);
        ``keep_stale_s``: how long /metrics serves the last GPU readings once stale; ``readers``: the side readers'
        states, shown in /metrics beside the source's (``gpus``)."""
        if interval_s <= 0:
            raise ValueError("interval must be positive")
        self._source = source
        self._interval = interval_s
        self._clock = clock or SystemClock()
        self._enrich = enrich
        self._dcgm_compat = dcgm_compat
        self._process_pids = process_pids
        self._user_names = user_names
        self._stale_after = stale_after_s if stale_after_s is not None else 3 * interval_s
        self._read_deadline = read_deadline_s if read_deadline_s is not None else self._stale_after
        self._keep_stale = keep_stale_s
        self._readers = dict(readers or {})
        self._worker = DeadlineWorker("gpulens-read")
        self._errors = ErrorCounter(log)
        self._xids = LastXidTracker()
        self._raw: NodeSnapshot | None = None  # the source's last good read, before enrichment
        self._snapshot: NodeSnapshot | None = None
        self._last_ok_monotonic: float | None = None
        self._last_ok_time: float | None = None
        self._last_duration: float | None = None
        self._last_error: str | None = None
        self._unavailable = False
        self._collections = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._first_done = threading.Event()
        self._thread: threading.Thread | None = None
        self._rendered_at = 0.0
        self._published = self._render()

    # -- collection ---------------------------------------------------------------------------------------------

    def collect_once(self) -> None:
        """Run one collection now (the thread calls this; tests may call it directly)."""
        started = time.perf_counter()
        raw = self._read()
        fresh = raw is not None
        with self._lock:
            if raw is None and not self._unavailable:
                raw = self._raw  # late or failed: the last good readings, so the side readers' parts stay current
        if raw is not None:
            try:
                snapshot = self._enrich(raw) if self._enrich is not None else raw
            except Exception as exc:  # noqa: BLE001 - a failed collection must never kill the exporter
                self._failed("source_failed", exc)
            else:
                with self._lock:
                    self._snapshot = snapshot
                    if fresh:
                        self._raw = raw
                        self._last_ok_monotonic = self._clock.monotonic()
                        self._last_ok_time = self._clock.now()
                        self._last_error = None
                        self._collections += 1
        self._last_duration = time.perf_counter() - started
        # The /metrics text is rendered by the first scrape that asks for it, once per collection: collections that
        # no scrape reads (Prometheus scrapes every 15-60 s, collections run every second) cost no rendering.
        published = self._render()
        with self._lock:
            self._published = published
        self._first_done.set()

    def _read(self) -> NodeSnapshot | None:
        """The source's readings now, or None (counted) when the read is late or failed."""
        try:
            raw = self._worker.run(self._source.read, self._read_deadline)
        except Late:
            hung = self._hung_since() is not None
            what = "NVML is hung" if hung else f"the source has not answered in {self._read_deadline:g}s"
            with self._lock:
                self._last_error = what
            self._errors.count("source_late", "collection late: %s; the last readings are served marked stale", what)
            return None
        except NodeUnavailableError as exc:
            with self._lock:
                self._unavailable = True
                self._last_error = str(exc)
            self._errors.count("node_unavailable", "node unavailable: %s", exc)
            return None
        except Exception as exc:  # noqa: BLE001 - a failed collection must never kill the exporter
            self._failed("nvml_hung" if self._hung_since() is not None else "source_failed", exc)
            return None
        with self._lock:
            self._unavailable = False
        return raw

    def _failed(self, reason: str, exc: Exception) -> None:
        with self._lock:
            self._last_error = f"{type(exc).__name__}: {exc}"
            self._unavailable = False
        self._errors.count(reason, "collection failed: %s (further failures are counted)", exc)

    def _hung_since(self) -> float | None:
        hung_since = getattr(self._source, "hung_since", None)
        return hung_since() if callable(hung_since) else None

    def wait_first(self, timeout_s: float) -> bool:
        """Wait until the first collection has ended (succeeded or failed); False if it is still running."""
        return self._first_done.wait(timeout_s)

    def _health(self) -> tuple[bool, dict[str, Any]]:
        with self._lock:
            last = self._last_ok_monotonic
            doc: dict[str, Any] = {
                "interval_seconds": self._interval,
                "collections": self._collections,
                "last_collect_timestamp_seconds": self._last_ok_time,
                "collect_duration_seconds": self._last_duration,
                "last_error": self._last_error,
            }
        failure = f": {doc['last_error']}" if doc["last_error"] else ""
        if last is None:
            if doc["collections"] == 0 and not doc["last_error"] and not self._first_done.is_set():
                doc["reason"] = "starting: the first collection has not finished"
            else:
                doc["reason"] = "no collection has succeeded yet" + failure
            return False, doc
        age = self._clock.monotonic() - last
        doc["age_seconds"] = round(age, 3)
        if age > self._stale_after:
            doc["reason"] = f"last successful collection {age:.1f}s ago (limit {self._stale_after:.1f}s)" + failure
            return False, doc
        doc["reason"] = "ok"
        return True, doc

    def _render(self) -> Published:
        self._rendered_at = self._clock.monotonic()
        healthy, doc = self._health()
        with self._lock:
            snapshot = self._snapshot
            unavailable = self._unavailable
        errors = dict(self._errors.snapshot())
        if snapshot is not None:
            for reason, count in snapshot.errors.items():
                errors[reason] = errors.get(reason, 0) + count
        age = doc.get("age_seconds")
        readers = {GPUS: ReaderState(age, stale=not healthy)}
        readers.update((name, state()) for name, state in sorted(self._readers.items()))
        hung_since = self._hung_since()
        if hung_since is None and snapshot is not None:
            hung_since = snapshot.nvml_hung_since
        health = ExporterHealth(
            collect_duration_seconds=self._last_duration,
            last_collect_timestamp_seconds=doc["last_collect_timestamp_seconds"],
            collect_errors=errors,
            readers=readers,
        )
        served = metrics = None
        if snapshot is not None:
            # A late part is served as it was last read, marked stale with its age. The snapshot document withdraws
            # stale GPU readings (a collector would take them for new); /metrics keeps them for KEEP_STALE_S.
            late = {name: state.age_s for name, state in readers.items() if state.stale and state.age_s is not None}
            marked = snapshot.replace(stale={**snapshot.stale, **late}, nvml_hung_since=hung_since)
            served = without_gpus(marked) if GPUS in late else marked
            metrics = without_gpus(marked) if late.get(GPUS, 0.0) > self._keep_stale else marked
            doc["stale"] = dict(marked.stale)
            if hung_since is not None:
                doc["nvml_hung_since"] = hung_since
        last_xid = self._xids.update(snapshot) if snapshot is not None else None
        return Published(
            served,
            health,
            healthy=healthy,
            health_doc=doc,
            dcgm_compat=self._dcgm_compat,
            last_xid=last_xid,
            unavailable=unavailable,
            process_pids=self._process_pids,
            metrics_snapshot=metrics,
            user_names=self._user_names,
        )

    def published(self) -> Published:
        with self._lock:
            published = self._published
            last = self._last_ok_monotonic
        # Health is judged at request time, so a stalled collector turns /healthz red (and marks its readings
        # stale) without a new collection; a stale one is re-rendered at most once a second, with its age.
        now = self._clock.monotonic()
        late = last is not None and now - last > self._stale_after
        if late and (published.healthy or now - self._rendered_at >= 1.0):
            rendered = self._render()
            with self._lock:
                if self._published is published:  # a collection may have published since
                    self._published = rendered
                published = self._published
        return published

    # -- thread ---------------------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="gpulens-collect", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.collect_once()
            next_at += self._interval
            delay = next_at - time.monotonic()
            if delay < 0:  # fell behind: skip the missed ticks rather than bursting
                next_at = time.monotonic()
                delay = 0.0
            self._stop.wait(delay)

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop collecting. A collection blocked in its source (a dripping dcgm-exporter) is not waited for beyond
        ``timeout_s``: the thread is a daemon and ends with the process."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
            self._thread = None
        self._worker.close()


class OnDemandNode:
    """One node of a multi-node source, computed when asked and cached for as long as its snapshot is current."""

    def __init__(
        self,
        source: MultiNodeSource,
        node: str,
        *,
        dcgm_compat: bool = False,
        process_pids: bool = False,
        user_names: bool = True,
    ) -> None:
        self._source = source
        self._node = node
        self._dcgm_compat = dcgm_compat
        self._process_pids = process_pids
        self._user_names = user_names
        self._xids = LastXidTracker()
        self._cache: tuple[float, Published] | None = None
        self._lock = threading.Lock()

    def published(self) -> Published:
        started = time.perf_counter()
        try:
            snapshot = self._source.read_node(self._node)
        except NodeUnavailableError as exc:
            doc: dict[str, Any] = {"reason": str(exc)}
            return Published(
                None,
                ExporterHealth(),
                healthy=False,
                health_doc=doc,
                dcgm_compat=False,
                last_xid=None,
                unavailable=True,
            )
        with self._lock:
            if self._cache is not None and self._cache[0] == snapshot.timestamp:
                return self._cache[1]
            last_xid = self._xids.update(snapshot)
        duration = time.perf_counter() - started
        health = ExporterHealth(
            collect_duration_seconds=duration,
            last_collect_timestamp_seconds=snapshot.timestamp,
            collect_errors=snapshot.errors,
        )
        ok_doc: dict[str, Any] = {
            "reason": "ok",
            "last_collect_timestamp_seconds": snapshot.timestamp,
            "collect_duration_seconds": duration,
        }
        published = Published(
            snapshot,
            health,
            healthy=True,
            health_doc=ok_doc,
            dcgm_compat=self._dcgm_compat,
            last_xid=last_xid,
            process_pids=self._process_pids,
            user_names=self._user_names,
        )
        with self._lock:
            self._cache = (snapshot.timestamp, published)
        return published
