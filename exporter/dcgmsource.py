"""The ``dcgm`` source: read a local dcgm-exporter's ``/metrics`` page and turn it into gpulens records.

``DcgmSource`` fetches the page over HTTP and converts it with ``gpulens.dcgmnode.DcgmPageReader``, the converter the
collector uses too (parsing rules: ``gpulens.dcgmpage``; XID counters, lost GPUs, node name: ``gpulens.dcgmnode``). It
keeps cumulative error counts. A page that cannot be used (no GPU series) fails the read with the reason, so
``/healthz`` reports it; the page's limit hits (``gpulens.promtext.TextLimits``) are counted by reason. The memory
of GPUs seen lives in the reader: restarting the exporter forgets a lost GPU.
"""

from __future__ import annotations

import functools
import logging
import socket
import threading
from collections.abc import Mapping

from gpulens.clock import Clock, SystemClock
from gpulens.dcgmnode import GPU_MISSING, DcgmPageError, DcgmPageReader
from gpulens.dcgmpage import BAD_LINES, FETCH_FAILED, DcgmParse
from gpulens.httpfetch import Fetch, check_url, fetch_url, redact_url
from gpulens.logutil import LogOnce
from gpulens.model import NodeSnapshot, SourceError
from gpulens.promtext import PageDecodeError, decode_page

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
        self._reader = DcgmPageReader(url, node=node, fallback_node=self._fallback_node, label=self._safe_url)

    def read(self) -> NodeSnapshot:
        """Scrape and convert now. Raises ``SourceError`` when the page cannot be fetched or used."""
        with self._lock:
            now = self._clock.now()
            text = self._fetch_text()
            try:
                result = self._reader.read(text, now)
            except DcgmPageError as exc:
                self._count(exc.reason, 1, "dcgm-exporter at %s: %s", self._safe_url, exc)
                raise SourceError(f"dcgm-exporter at {self._safe_url} sent a page that cannot be used: {exc}") from None
            self._count_problems(result.parsed, result.problems)
            return result.snapshot.replace(errors=dict(self._errors))

    def forget(self, uuid: str) -> bool:
        """Stop reporting a vanished GPU as down (it was retired)."""
        with self._lock:
            return self._reader.forget(uuid)

    def close(self) -> None:
        """Nothing to release: each read opens and closes its own connection."""

    def _fetch_text(self) -> str:
        try:
            body = self._fetch(self._url, self._timeout_s)
            if len(body) > self._max_bytes:
                raise SourceError(f"dcgm-exporter at {self._safe_url} sent more than {self._max_bytes} bytes")
            try:
                return decode_page(body)
            except PageDecodeError as exc:
                raise SourceError(f"dcgm-exporter at {self._safe_url} sent a body that is {exc}") from None
        except SourceError as exc:
            self._count(FETCH_FAILED, 1, "reading dcgm-exporter failed: %s", exc)
            raise

    def _count(self, reason: str, n: int, message: str, *args: object) -> None:
        if n > 0:
            self._errors[reason] = self._errors.get(reason, 0) + n
            self._log_once(reason, message, *args)

    def _count_problems(self, parsed: DcgmParse, problems: dict[str, int] | Mapping[str, int]) -> None:
        for reason, n in problems.items():
            if reason == BAD_LINES:
                self._count(
                    reason,
                    n,
                    "dcgm-exporter at %s sent malformed lines (first at line %s; by reason: %s)",
                    self._safe_url,
                    parsed.first_bad_line,
                    dict(parsed.bad_line_reasons),
                )
            elif reason == GPU_MISSING:
                self._count(
                    reason, n, "dcgm-exporter at %s: GPUs vanished from the page (reported down)", self._safe_url
                )
            else:
                self._count(reason, n, "dcgm-exporter at %s: dropped values (%s)", self._safe_url, reason)
