"""The ``dcgm`` source: read a local dcgm-exporter's ``/metrics`` page and turn it into gpulens records.

``DcgmSource`` fetches the page over HTTP, parses it with ``gpulens.dcgmpage.parse_dcgm_metrics`` (whose docstring holds
the parsing rules), keeps cumulative error counts and turns DCGM's last-XID gauge into per-code counters.
"""

from __future__ import annotations

import functools
import logging
import socket
import threading
from collections.abc import Mapping
from dataclasses import replace

from gpulens.clock import Clock, SystemClock
from gpulens.dcgmpage import BAD_LINES, FETCH_FAILED, DcgmParse, parse_dcgm_metrics
from gpulens.httpfetch import Fetch, check_url, fetch_url, redact_url
from gpulens.logutil import LogOnce
from gpulens.model import NodeSnapshot, SourceError

log = logging.getLogger(__name__)


# --- the source ----------------------------------------------------------------------------------------------------


class DcgmSource:
    """A ``GpuSource`` that scrapes a dcgm-exporter. Keeps cumulative error counts and XID counters per GPU."""

    def __init__(
        self,
        url: str,
        *,
        node: str | None = None,
        clock: Clock | None = None,
        timeout_s: float = 5.0,
        max_bytes: int = 16 * 1024 * 1024,
        fetch: Fetch | None = None,
    ) -> None:
        try:
            check_url(url)
        except ValueError as exc:
            raise ValueError(f"dcgm-exporter {exc}") from None
        if timeout_s <= 0 or max_bytes <= 0:
            raise ValueError("timeout_s and max_bytes must be positive")
        self._url = url
        self._safe_url = redact_url(url)
        self._node = node
        self._fallback_node = socket.gethostname()
        self._clock = clock or SystemClock()
        self._timeout_s = timeout_s
        self._max_bytes = max_bytes
        self._fetch = fetch or functools.partial(fetch_url, max_bytes=max_bytes)
        self._lock = threading.Lock()
        self._errors: dict[str, int] = {}
        self._log_once = LogOnce(log)
        self._last_xid: dict[str, int] = {}
        self._xid_counts: dict[str, dict[int, int]] = {}

    def read(self) -> NodeSnapshot:
        """Scrape and parse now. Raises ``SourceError`` when the page cannot be fetched or holds no sample."""
        with self._lock:
            now = self._clock.now()
            text = self._fetch_text()
            parsed = parse_dcgm_metrics(text, node=self._node, timestamp=now, fallback_node=self._fallback_node)
            self._count_problems(parsed)
            if parsed.samples == 0 and parsed.bad_lines:
                raise SourceError(
                    f"dcgm-exporter at {self._safe_url} sent no valid sample ({parsed.bad_lines} bad lines)"
                )
            self._count_xids(parsed.last_xid)
            gpus = tuple(replace(g, xid_errors=dict(self._xid_counts.get(g.uuid, {}))) for g in parsed.gpus)
            return NodeSnapshot(
                node=parsed.node or self._fallback_node,
                timestamp=now,
                source="dcgm",
                gpus=gpus,
                jobs=parsed.jobs,
                migs=parsed.migs,
                driver_version=parsed.driver_version,
                errors=dict(self._errors),
            )

    def close(self) -> None:
        """Nothing to release: each read opens and closes its own connection."""

    def _fetch_text(self) -> str:
        try:
            body = self._fetch(self._url, self._timeout_s)
            if len(body) > self._max_bytes:
                raise SourceError(f"dcgm-exporter at {self._safe_url} sent more than {self._max_bytes} bytes")
            try:
                return body.decode("utf-8-sig")
            except UnicodeDecodeError as exc:
                raise SourceError(
                    f"dcgm-exporter at {self._safe_url} sent a body that is not UTF-8 (byte {exc.start})"
                ) from None
        except SourceError as exc:
            self._count(FETCH_FAILED, 1, "reading dcgm-exporter failed: %s", exc)
            raise

    def _count(self, reason: str, n: int, message: str, *args: object) -> None:
        if n > 0:
            self._errors[reason] = self._errors.get(reason, 0) + n
            self._log_once(reason, message, *args)

    def _count_problems(self, parsed: DcgmParse) -> None:
        for reason, n in parsed.error_counts().items():
            if reason == BAD_LINES:
                self._count(
                    reason,
                    n,
                    "dcgm-exporter at %s sent malformed lines (first at line %s; by reason: %s)",
                    self._safe_url,
                    parsed.first_bad_line,
                    dict(parsed.bad_line_reasons),
                )
            else:
                self._count(reason, n, "dcgm-exporter at %s: dropped values (%s)", self._safe_url, reason)

    def _count_xids(self, last_xid: Mapping[str, int]) -> None:
        for uuid, code in last_xid.items():
            previous = self._last_xid.get(uuid)
            self._last_xid[uuid] = code
            if code and code != previous:
                counts = self._xid_counts.setdefault(uuid, {})
                counts[code] = counts.get(code, 0) + 1
