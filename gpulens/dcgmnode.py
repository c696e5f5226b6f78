"""Reading one dcgm-exporter over time: ``DcgmPageReader`` turns its successive pages into ``NodeSnapshot``s.

The one converter from a dcgm-exporter page to a node snapshot, shared by the exporter's ``dcgm`` source and the
collector's ``kind = "dcgm"`` targets (each keeps one reader per dcgm-exporter it reads). A page is parsed by
``gpulens.dcgmpage``; what needs memory across pages is here:

* **XID counters** (``GpuReading.xid_errors``: code -> events seen since the reader started). Where the page serves
  ``DCGM_EXP_XID_ERRORS_COUNT`` (XIDs per code within dcgm-exporter's window), each rise of a code's window count
  adds the rise (the first page adds its counts; a fall is events leaving the window). Otherwise the sticky
  last-XID field counts one event each time it changes to a non-zero code (43 -> 0 -> 43 counts twice); a repeat of
  the same code between two pages cannot be seen from it.
* **Throttle reasons** where the page has no clock-event reasons (dcgm-exporter's default counters): from the
  clock-event window counts, the ``*_VIOLATION`` counters' rise since the previous page, or inferred from clock,
  temperature and power, each reading saying which (``gpulens.dcgmthrottle``).
* **Lost GPUs.** A GPU seen before and missing from a page that still has GPUs is reported down (``up=False``,
  identity and XID counts kept, as the NVML source reports a lost GPU) until it comes back; the event is counted
  once as ``dcgm_gpu_missing`` and logged once. Nothing is persisted: restarting the exporter or the collector, or
  ``forget(uuid)``, forgets a lost GPU.
* **Pages that say nothing.** A page without a single GPU series (an empty body, an unknown format) raises
  ``DcgmPageError`` with the reason; it is never reported as a healthy node without GPUs. A page whose last line
  has no line feed (maybe cut in transit) is read without that line, counted as ``dcgm_truncated``.
* **Node name.** Configuration first (the target's ``node`` / the exporter's ``--node``), then the host of the URL
  (unless it is a loopback name or address: NVIDIA's ``-r localhost:5555`` setup), then the page's ``hostname`` /
  ``Hostname`` label (unless it is ``localhost``), then the caller's fallback (both readers pass this machine's
  host name: a loopback URL means the dcgm-exporter runs here).
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Final
from urllib.parse import urlsplit

from gpulens.dcgmpage import DcgmParse, parse_dcgm_metrics
from gpulens.dcgmthrottle import ThrottleTracker
from gpulens.model import GpuReading, NodeSnapshot

log = logging.getLogger(__name__)

GPU_MISSING: Final = "dcgm_gpu_missing"
TRUNCATED: Final = "dcgm_truncated"  # counted by gpulens.dcgmpage (promtext's "truncated", prefixed)
NO_GPU_SERIES: Final = "dcgm_no_gpu_series"
_LOOPBACK_NAMES: Final = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


class DcgmPageError(Exception):
    """The page cannot be used (no GPU series); ``reason`` is the error-count key."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def is_loopback(host: str | None) -> bool:
    """True for names and addresses that mean "this machine" and so name no node."""
    if not host:
        return True
    name = host.strip("[]").lower()
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback or ipaddress.ip_address(name).is_unspecified
    except ValueError:
        return False


def url_host(url: str) -> str | None:
    """The URL's host when it names a machine (``None`` for loopback)."""
    try:
        host = urlsplit(url).hostname
    except ValueError:
        return None
    return None if is_loopback(host) else host


def choose_node(configured: str | None, url: str, page_label: str | None, fallback: str) -> str:
    """Configuration, then the URL's host, then the page's label, then ``fallback`` (see the module docstring)."""
    if configured:
        return configured
    host = url_host(url)
    if host:
        return host
    if page_label and not is_loopback(page_label):
        return page_label
    return fallback


@dataclass(slots=True)
class _Known:
    """What is remembered of a GPU seen on a page: its identity, XID state, and whether it is missing now."""

    reading: GpuReading
    last_xid: int | None = None
    xid_window: dict[int, int] | None = None
    xid_counts: dict[int, int] = field(default_factory=dict)
    missing: bool = False


@dataclass(frozen=True, slots=True)
class DcgmRead:
    """One page read: the snapshot, the page's parse, and this page's problem counts by reason."""

    snapshot: NodeSnapshot
    parsed: DcgmParse
    problems: Mapping[str, int]


class DcgmPageReader:
    """Turns the successive pages of one dcgm-exporter into snapshots. Not thread-safe: one caller at a time."""

    def __init__(self, url: str, *, node: str | None, fallback_node: str, label: str | None = None) -> None:
        self.url = url
        self.configured_node = node
        self._fallback = fallback_node
        self._label = label or url
        self._known: dict[str, _Known] = {}
        self._throttle = ThrottleTracker()

    def read(self, text: str, now: float) -> DcgmRead:
        """Parse one page. Raises ``DcgmPageError`` for a page without GPU series."""
        parsed = parse_dcgm_metrics(text, node=None, timestamp=now, fallback_node=self._fallback)
        if not parsed.gpus:
            example = f", e.g. {parsed.example_name!r}" if parsed.example_name else ""
            raise DcgmPageError(NO_GPU_SERIES, f"no GPU series on the page ({parsed.samples} samples{example})")
        node = choose_node(self.configured_node, self.url, parsed.node, self._fallback)
        problems = dict(parsed.error_counts())
        gpus: list[GpuReading] = []
        seen = set()
        for g in parsed.gpus:
            seen.add(g.uuid)
            known = self._known.get(g.uuid)
            if known is None:
                known = self._known[g.uuid] = _Known(g)
            elif known.missing:
                known.missing = False
                log.warning("%s: GPU %d (%s) is back on the page", self._label, g.gpu, g.uuid)
            g = known.reading = self._throttle.apply(g, parsed.clock_event_counts.get(g.uuid))
            self._count_xids(known, parsed.last_xid.get(g.uuid), parsed.xid_window_counts.get(g.uuid))
            gpus.append(replace(g, node=node, xid_errors=dict(known.xid_counts)))
        for uuid, known in self._known.items():
            if uuid in seen:
                continue
            if not known.missing:
                known.missing = True
                problems[GPU_MISSING] = problems.get(GPU_MISSING, 0) + 1
                log.warning(
                    "%s: GPU %d (%s) is missing from the page: reported down until it returns",
                    self._label,
                    known.reading.gpu,
                    uuid,
                )
            gpus.append(self._down(known, node, now))
        gpus.sort(key=lambda g: (g.gpu, g.uuid))
        snapshot = NodeSnapshot(
            node=node,
            timestamp=now,
            source="dcgm",
            gpus=tuple(gpus),
            jobs=tuple(replace(j, node=node) for j in parsed.jobs),
            migs=tuple(replace(m, node=node) for m in parsed.migs),
            driver_version=parsed.driver_version,
        )
        return DcgmRead(snapshot, parsed, problems)

    def forget(self, uuid: str) -> bool:
        """Forget a GPU (an operator retired it): it is no longer reported down. True when it was known."""
        self._throttle.forget(uuid)
        return self._known.pop(uuid, None) is not None

    @property
    def missing(self) -> list[str]:
        """UUIDs of the GPUs reported down because they vanished from the page."""
        return [uuid for uuid, known in self._known.items() if known.missing]

    @staticmethod
    def _down(known: _Known, node: str, now: float) -> GpuReading:
        g = known.reading
        return GpuReading(
            node=node,
            gpu=g.gpu,
            uuid=g.uuid,
            model=g.model,
            timestamp=now,
            up=False,
            pci_bus_id=g.pci_bus_id,
            driver_version=g.driver_version,
            xid_errors=dict(known.xid_counts),
        )

    @staticmethod
    def _count_xids(known: _Known, last_xid: int | None, window: Mapping[int, int] | None) -> None:
        counts = known.xid_counts
        if window is not None:
            before = known.xid_window or {}
            for code, count in window.items():
                rise = count - before.get(code, 0)
                if rise > 0:
                    counts[code] = counts.get(code, 0) + rise
            known.xid_window = dict(window)
        elif last_xid is not None and last_xid and last_xid != known.last_xid:
            counts[last_xid] = counts.get(last_xid, 0) + 1
        if last_xid is not None:
            known.last_xid = last_xid
