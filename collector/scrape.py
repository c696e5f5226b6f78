"""Scraping targets: fetch them all at once over HTTP(S) with keep-alive, parse each as it lands, and reject bad
samples one by one. The transfers run in the calling thread over libcurl's multi interface (``gpulens.multifetch``).

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
import logging
import math
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter, is_not
from typing import Final
from urllib.parse import urlsplit

from gpulens.clock import Clock, SystemClock
from gpulens.collector.targets import Target
from gpulens.config import ConfigError
from gpulens.dcgmnode import DcgmPageError, DcgmPageReader
from gpulens.httpfetch import redact_url
from gpulens.metriccatalogue import fields_in
from gpulens.model import LINKS_INACTIVE, GpuReading, NodeSnapshot, SnapshotFormatError, TargetHealth
from gpulens.multifetch import ABORTED, Get, MultiFetcher, Outcome
from gpulens.promtext import DEFAULT_LIMITS, PageDecodeError, decode_page
from gpulens.snapshotcodec import LAYOUT_COLUMNAR, SnapshotNotJSONError, snapshot_from_bytes
from gpulens.storedrange import (
    GPU_LIMIT,
    GPUS_PER_TARGET,
    LINK_OUT_OF_RANGE,
    PID_OUT_OF_RANGE,
    all_links_storable,
    all_storable,
    bound_reading,
    link_storable,
    process_storable,
)

log = logging.getLogger(__name__)

_RATIO_FIELDS: Final = fields_in("ratio")  # every 0-1 field, by its range in the metric catalogue
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
_memory = attrgetter("memory_used_bytes", "memory_total_bytes")
_TIMESTAMP, _POWER, _NODE, _UUID = map(attrgetter, ("timestamp", "power_watts", "node", "uuid"))
# Query asking a gpulens exporter for the columnar snapshot with only the inactive links (the collector stores link
# outages, and each GPU's NVLink totals are in its reading): older exporters ignore what they do not know.
SNAPSHOT_QUERY = f"layout={LAYOUT_COLUMNAR}&links={LINKS_INACTIVE}"
# A job id in a snapshot is held to a label value's length on a page (gpulens.promtext.TextLimits).
_JOB_ID_MAX: Final = DEFAULT_LIMITS.label_value_length
JOB_ID_TOO_LONG: Final = "job_id_too_long"


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


def _all_plausible(gpus: Sequence[GpuReading], node: str, now: float, future_tolerance_s: float) -> bool:
    """Whether no reading of a node would be rejected: ``_reject_reason``'s checks over all its readings at once,
    each a pass in C over every reading's values (the common case; one reading per GPU and check costs more).
    ``filter(None, ...)`` drops the unknowns and the zeros alike, and neither decides a bound; a NaN makes a bound's
    comparison false, so that node goes reading by reading."""
    if not gpus:
        return True
    stamps = list(map(_TIMESTAMP, gpus))
    memory = [(used, total) for used, total in map(_memory, gpus) if used is not None and total is not None]
    return (
        all(map(math.isfinite, stamps))
        and max(stamps) <= now + future_tolerance_s
        and min(filter(None, chain.from_iterable(map(_non_negative, gpus))), default=0) >= 0
        and max(filter(None, chain.from_iterable(map(_ratios, gpus))), default=0) <= 1.0
        and all(used <= total * 1.05 for used, total in memory)
        and max(filter(None, chain.from_iterable(map(_temperatures, gpus))), default=0) <= 250
        and max(filter(None, map(_POWER, gpus)), default=0) <= 20_000
        and set(map(_NODE, gpus)) == {node}
        and len(set(map(_UUID, gpus))) == len(gpus)
        and len(gpus) <= GPUS_PER_TARGET
        and all_storable(gpus)
    )


def sanitize(snapshot: NodeSnapshot, now: float, future_tolerance_s: float) -> tuple[NodeSnapshot, dict[str, int]]:
    """Drop the readings that cannot be true (and duplicate GPUs), the values storage cannot hold, and the GPUs past
    ``GPUS_PER_TARGET``, counting each by reason (``gpulens.storedrange``)."""
    if (
        _all_plausible(snapshot.gpus, snapshot.node, now, future_tolerance_s)
        and all_links_storable(snapshot.links)
        and all(map(process_storable, snapshot.processes))
        and all(len(j.job_id) <= _JOB_ID_MAX for j in snapshot.jobs)
    ):
        return snapshot, {}
    return sanitize_each(snapshot, now, future_tolerance_s)


def sanitize_each(snapshot: NodeSnapshot, now: float, future_tolerance_s: float) -> tuple[NodeSnapshot, dict[str, int]]:
    """``sanitize`` reading by reading, without the all-plausible shortcut: the reason of each rejection."""
    rejected: dict[str, int] = {}
    kept: list[GpuReading] = []
    seen: set[str] = set()
    for g in snapshot.gpus:
        reason = "duplicate_gpu" if g.uuid in seen else _reject_reason(g, now, future_tolerance_s)
        if reason is None and g.node != snapshot.node:
            reason = "node_mismatch"
        if reason is None and len(kept) >= GPUS_PER_TARGET:
            reason = GPU_LIMIT
        if reason is not None:
            rejected[reason] = rejected.get(reason, 0) + 1
            continue
        bounded = bound_reading(g, rejected)  # values storage cannot hold dropped alone; an index it cannot, the GPU
        if bounded is None:
            continue
        seen.add(g.uuid)
        kept.append(bounded)
    keep = {g.uuid for g in kept}
    jobs = tuple(x for x in snapshot.jobs if x.uuid in keep and len(x.job_id) <= _JOB_ID_MAX)
    links = tuple(x for x in snapshot.links if x.uuid in keep and link_storable(x))
    processes = tuple(x for x in snapshot.processes if x.uuid in keep and process_storable(x))
    for reason, bad in (
        (LINK_OUT_OF_RANGE, sum(not link_storable(x) for x in snapshot.links)),
        (PID_OUT_OF_RANGE, sum(not process_storable(x) for x in snapshot.processes)),
        (JOB_ID_TOO_LONG, sum(len(x.job_id) > _JOB_ID_MAX for x in snapshot.jobs)),
    ):
        if bad:
            rejected[reason] = rejected.get(reason, 0) + bad
    if not rejected:
        return snapshot, rejected
    return (
        snapshot.replace(
            gpus=tuple(kept),
            links=links,
            processes=processes,
            jobs=jobs,
            migs=tuple(x for x in snapshot.migs if x.uuid in keep),
        ),
        rejected,
    )


class Scraper:
    """Scrapes targets concurrently from the calling thread (``gpulens.multifetch``), connections kept alive between
    rounds; each target's answer is parsed as soon as it lands, while the others are still in flight."""

    def __init__(
        self,
        *,
        timeout_s: float = 5.0,
        max_bytes: int = 16 * 1024 * 1024,
        future_tolerance_s: float = 300.0,
        concurrency: int = 64,
        clock: Clock | None = None,
    ) -> None:
        self._timeout = timeout_s
        self._max_bytes = max_bytes
        self._future = future_tolerance_s
        self._concurrency = concurrency
        self._clock = clock or SystemClock()
        self._fetcher = MultiFetcher(user_agent="gpulens-collector")
        self._lock = threading.Lock()
        self._readers: dict[str, DcgmPageReader] = {}  # dcgm targets by name: what each page needs from the last
        self.aborted = False

    def abort(self) -> None:
        """Cut every request in flight short, and refuse new ones (shutdown): a dripping target cannot hold it."""
        self.aborted = True
        self._fetcher.abort()

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
        """One target (``scrape_all`` of one)."""
        return self.scrape_all([target])[0]

    def scrape_all(self, targets: Sequence[Target]) -> list[ScrapeResult]:
        """Every target, at most ``concurrency`` at a time, each within its own timeout; in the order given.
        Batches from several threads take turns."""
        now = self._clock.now()
        results: list[ScrapeResult | None] = [None] * len(targets)
        gets: list[Get] = []
        where: list[int] = []  # the target of each GET
        for i, target in enumerate(targets):
            try:
                gets.append(self._request(target))
                where.append(i)
            except ScrapeError as exc:
                results[i] = self._down(target, now, str(exc), 0.0)

        def done(index: int, outcome: Outcome) -> None:
            i = where[index]
            results[i] = self._result(targets[i], outcome, now)

        self._fetcher.run(gets, done, concurrency=self._concurrency)
        return [r if r is not None else self._down(targets[i], now, "not scraped", 0.0) for i, r in enumerate(results)]

    def _result(self, target: Target, outcome: Outcome, now: float) -> ScrapeResult:
        started = time.perf_counter()
        if outcome.error is not None:
            problem = "the collector is stopping" if outcome.error == ABORTED else outcome.error
            return self._down(target, now, problem, outcome.seconds)
        if outcome.status != 200:
            return self._down(target, now, outcome.reason, outcome.seconds)
        try:
            snapshot, rejected = self._parse(target, outcome.body, now)
        except ScrapeError as exc:
            seconds = outcome.seconds + time.perf_counter() - started
            return self._down(target, now, str(exc), seconds)
        seconds = outcome.seconds + time.perf_counter() - started
        return ScrapeResult(
            target, _health(target, now, seconds, snapshot=snapshot, rejected=rejected), snapshot, rejected
        )

    def _down(self, target: Target, now: float, problem: str, seconds: float) -> ScrapeResult:
        return ScrapeResult(target, _health(target, now, seconds, problem=problem))

    # -- parsing ----------------------------------------------------------------------------------------------------

    def _parse(self, target: Target, body: bytes, now: float) -> tuple[NodeSnapshot, dict[str, int]]:
        if target.kind == "dcgm":
            try:
                text = decode_page(body)
            except PageDecodeError as exc:
                raise ScrapeError(f"the response is {exc}") from None
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

    # -- the request ------------------------------------------------------------------------------------------------

    def _request(self, target: Target) -> Get:
        if self.aborted:
            raise ScrapeError("the collector is stopping")
        # a gpulens exporter is asked for the columnar layout and the inactive links
        plain = _plain_url(target.scrape_url, "" if target.kind == "dcgm" else SNAPSHOT_QUERY)
        headers: tuple[str, ...] = ()
        if target.auth.username:
            try:
                password = target.auth.password() or ""
            except ConfigError as exc:
                raise ScrapeError(str(exc)) from None
            token = base64.b64encode(f"{target.auth.username}:{password}".encode()).decode()
            headers = (f"Authorization: Basic {token}",)
        return Get(
            url=plain,
            timeout_s=self._timeout,
            max_bytes=self._max_bytes,
            headers=headers,
            ca_file=target.auth.ca_file,
            insecure=target.auth.insecure_skip_verify,
        )

    def close(self) -> None:
        """Close every connection (call when no scrape is running)."""
        self._fetcher.close()


def _health(
    target: Target,
    now: float,
    seconds: float,
    *,
    snapshot: NodeSnapshot | None = None,
    rejected: Mapping[str, int] | None = None,
    problem: str | None = None,
) -> TargetHealth:
    """The target's health after a scrape: up with its snapshot, or down for ``problem``."""
    return TargetHealth(
        target=target.name,
        url=redact_url(target.scrape_url),
        kind=target.kind,
        timestamp=now,
        up=snapshot is not None,
        node=target.node if snapshot is None else snapshot.node,
        scrape_duration_seconds=seconds,
        samples=0 if snapshot is None else len(snapshot.gpus),
        rejected=sum((rejected or {}).values()),
        last_error=problem,
    )


@functools.lru_cache(maxsize=1 << 16)  # the same targets every round: each URL is taken apart once
def _plain_url(url: str, ask: str) -> str:
    """The URL a target is fetched at: ``ask`` added to its query; a ``user:password@`` in it dropped (credentials
    come from the target's auth only)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ScrapeError(f"not an http(s) URL: {redact_url(url)}")
    query = parts.query
    if ask:
        query = f"{query}&{ask}" if query else ask
    return parts._replace(netloc=parts.netloc.rpartition("@")[2], query=query, fragment="").geturl()


def merge_counts(into: dict[str, int], more: Mapping[str, int]) -> None:
    for key, value in more.items():
        into[key] = into.get(key, 0) + value
