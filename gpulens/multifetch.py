"""Many HTTP(S) GETs at once from one thread, over libcurl's multi interface: the collector's scrape transport.

Why libcurl (through pycurl) rather than ``http.client`` in a thread pool: fetching the 1,000 snapshots of a
simulated 1,000-node round cost 0.50-0.69 CPU-s in 32 threads of ``http.client`` (each request built and each
response's headers parsed in Python, through the ``email`` package, plus the thread switches) against 0.21 CPU-s
through one multi handle, in the same run on the same exporter. libcurl does the protocol in C; Python sees one
call per finished transfer and one per chunk of body.

Every request gets:

* **One deadline** for the whole transfer (libcurl's total timeout): connecting, sending, and every byte of the
  answer. A target that drips its answer fails at its deadline, and never delays another request.
* **A size cap**: a declared ``Content-Length`` over it is refused before the body is read; the body, gunzipped by
  libcurl as it arrives, is cut off as soon as it passes the cap (a gzip bomb costs at most the cap).
* **Keep-alive**: connections stay in the multi handle's cache between calls, one per host and port.
* **No redirects and no proxy** from the environment; only http and https URLs (checked by the caller).
* **Abort**: ``abort()``, from any thread, ends the transfers in flight at once (each fails with ``ABORTED``).

Failures come back as a one-line reason (``Outcome.error``); they never quote the request's headers.
The event loop is libcurl's socket interface over ``epoll``, so the number of open connections (one per target
kept alive) is not limited by ``select``'s 1,024 descriptors.
"""

from __future__ import annotations

import contextlib
import http
import os
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import pycurl

ABORTED: Final = "aborted"
_CONNECTIONS_AT_LEAST: Final = 16  # connections kept alive: at least this many, and one per request of the last call
_MAX_WAIT_S: Final = 1.0  # the longest epoll wait without news from libcurl (a safety net, not a timing)
_ERRNO_REFUSED: Final = 111  # ECONNREFUSED on Linux


@dataclass(frozen=True)
class Get:
    """One GET: the URL (no credentials in it), extra header lines ("Name: value"), its deadline and size cap."""

    url: str
    timeout_s: float
    max_bytes: int
    headers: tuple[str, ...] = ()
    ca_file: str | None = None  # trust this CA bundle for https instead of the system's
    insecure: bool = False  # https without verifying the certificate or the host name


@dataclass(frozen=True)
class Outcome:
    """How a GET ended: the HTTP status (0 when none came) and the body, or the reason it failed."""

    status: int
    body: bytes = b""
    error: str | None = None
    seconds: float = 0.0  # from the start of the transfer to its end

    @property
    def reason(self) -> str:
        """``HTTP 500 Internal Server Error``: the status and its standard phrase."""
        try:
            phrase = http.HTTPStatus(self.status).phrase
        except ValueError:
            phrase = ""
        return f"HTTP {self.status} {phrase}".strip()


Done = Callable[[int, Outcome], None]


class _Transfer:
    """One request in flight: where its body goes, and whether it passed the size cap."""

    __slots__ = ("chunks", "get", "index", "over", "size")

    def __init__(self, index: int, get: Get) -> None:
        self.index = index
        self.get = get
        self.chunks: list[bytes] = []
        self.size = 0
        self.over = False

    def write(self, data: bytes) -> int | None:
        self.size += len(data)
        if self.size > self.get.max_bytes:
            self.over = True
            return 0  # libcurl ends the transfer with a write error
        self.chunks.append(data)
        return None


def _system_trust() -> tuple[str | None, str | None]:
    """The CA file and directory Python's own TLS trusts by default (libcurl's built-in guess may not exist here)."""
    paths = ssl.get_default_verify_paths()
    cafile = paths.cafile if paths.cafile and os.path.exists(paths.cafile) else None
    capath = paths.capath if paths.capath and os.path.isdir(paths.capath) else None
    return cafile, capath


class MultiFetcher:
    """Runs batches of GETs concurrently in the calling thread. One batch at a time; ``abort`` from any thread."""

    def __init__(self, *, user_agent: str = "gpulens") -> None:
        self._user_agent = user_agent
        self._multi = pycurl.CurlMulti()
        self._multi.setopt(pycurl.M_SOCKETFUNCTION, self._on_socket)
        self._multi.setopt(pycurl.M_TIMERFUNCTION, self._on_timer)
        self._poll = select.epoll()
        self._watched: dict[int, int] = {}  # descriptor -> epoll mask, as libcurl asked
        self._due: float | None = None  # when libcurl wants its timeout action (monotonic)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._poll.register(self._wake_r.fileno(), select.EPOLLIN)
        self._idle: list[pycurl.Curl] = []
        self._running: dict[pycurl.Curl, _Transfer] = {}
        self._trust = _system_trust()
        self._busy = threading.Lock()
        self._aborted = False

    # -- libcurl's callbacks: keep them trivial (an exception in them is printed by pycurl, not raised) --------------

    def _on_socket(self, what: int, fd: int, multi: object, data: object) -> None:
        if what == pycurl.POLL_REMOVE:
            if self._watched.pop(fd, None) is not None:
                with contextlib.suppress(OSError, ValueError):
                    self._poll.unregister(fd)
            return
        mask = (select.EPOLLIN if what & pycurl.POLL_IN else 0) | (select.EPOLLOUT if what & pycurl.POLL_OUT else 0)
        try:
            if fd in self._watched:
                self._poll.modify(fd, mask)
            else:
                self._poll.register(fd, mask)
        except OSError:  # a descriptor closed and reused behind our back: watch it afresh
            with contextlib.suppress(OSError):
                self._poll.unregister(fd)
            self._poll.register(fd, mask)
        self._watched[fd] = mask

    def _on_timer(self, timeout_ms: int) -> None:
        self._due = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000

    # -- the batch ---------------------------------------------------------------------------------------------------

    def abort(self) -> None:
        """End the transfers in flight now (each reports ``ABORTED``), and every later batch at once."""
        self._aborted = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def run(self, gets: Sequence[Get], done: Done, *, concurrency: int) -> None:
        """Fetch ``gets``, at most ``concurrency`` at a time; ``done(index, outcome)`` is called in this thread as
        each ends (so the caller's work on one answer overlaps the others' transfers). Returns when all are done."""
        with self._busy:
            self._multi.setopt(pycurl.M_MAXCONNECTS, max(_CONNECTIONS_AT_LEAST, len(gets)))
            waiting = list(reversed(range(len(gets))))
            try:
                while waiting or self._running:
                    if self._aborted:
                        break
                    while waiting and len(self._running) < concurrency:
                        index = waiting.pop()
                        self._start(_Transfer(index, gets[index]))
                    self._wait()
                    self._harvest(done)
            finally:
                # aborted, or ``done`` raised: nothing may stay in the multi handle for the next batch
                for curl, transfer in list(self._running.items()):
                    self._finish(curl)
                    if self._aborted:
                        done(transfer.index, Outcome(0, error=ABORTED))
            for index in reversed(waiting):
                done(index, Outcome(0, error=ABORTED))

    def _start(self, transfer: _Transfer) -> None:
        get = transfer.get
        curl = self._idle.pop() if self._idle else pycurl.Curl()
        curl.reset()  # every option set below, for every request: nothing leaks from the last target
        curl.setopt(pycurl.URL, get.url)
        curl.setopt(pycurl.NOSIGNAL, 1)
        curl.setopt(pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_1_1)
        curl.setopt(pycurl.PROXY, "")  # an explicit empty proxy: the environment's *_proxy are not used
        curl.setopt(pycurl.ACCEPT_ENCODING, "gzip")
        curl.setopt(pycurl.USERAGENT, self._user_agent)
        curl.setopt(pycurl.HTTPHEADER, list(get.headers))
        timeout_ms = max(1, int(get.timeout_s * 1000))
        curl.setopt(pycurl.TIMEOUT_MS, timeout_ms)
        curl.setopt(pycurl.CONNECTTIMEOUT_MS, timeout_ms)
        curl.setopt(pycurl.MAXFILESIZE_LARGE, get.max_bytes)
        curl.setopt(pycurl.WRITEFUNCTION, transfer.write)
        if get.url.startswith("https:"):
            if get.insecure:
                curl.setopt(pycurl.SSL_VERIFYPEER, 0)
                curl.setopt(pycurl.SSL_VERIFYHOST, 0)
            elif get.ca_file:
                curl.setopt(pycurl.CAINFO, get.ca_file)
            else:
                cafile, capath = self._trust
                if cafile:
                    curl.setopt(pycurl.CAINFO, cafile)
                if capath:
                    curl.setopt(pycurl.CAPATH, capath)
        self._running[curl] = transfer
        self._multi.add_handle(curl)

    def _wait(self) -> None:
        """Wait for a socket libcurl watches, libcurl's timer or ``abort``, and let libcurl act on what happened."""
        wait = _MAX_WAIT_S if self._due is None else min(_MAX_WAIT_S, max(0.0, self._due - time.monotonic()))
        events = self._poll.poll(wait)
        wake = self._wake_r.fileno()
        for fd, event in events:
            if fd == wake:
                with contextlib.suppress(OSError):
                    self._wake_r.recv(64)
                continue
            flags = (pycurl.CSELECT_IN if event & select.EPOLLIN else 0) | (
                pycurl.CSELECT_OUT if event & select.EPOLLOUT else 0
            )
            if event & (select.EPOLLERR | select.EPOLLHUP):
                flags |= pycurl.CSELECT_ERR
            self._multi.socket_action(fd, flags)
        if not events or (self._due is not None and time.monotonic() >= self._due):
            self._due = None
            self._multi.socket_action(pycurl.SOCKET_TIMEOUT, 0)

    def _harvest(self, done: Done) -> None:
        while True:
            queued, succeeded, failed = self._multi.info_read()
            for curl in succeeded:
                transfer = self._running[curl]
                status = int(curl.getinfo(pycurl.RESPONSE_CODE))
                seconds = float(curl.getinfo(pycurl.TOTAL_TIME))
                self._finish(curl)
                done(transfer.index, Outcome(status, b"".join(transfer.chunks), None, seconds))
            for curl, code, message in failed:
                transfer = self._running[curl]
                error = _reason(code, message, transfer, int(curl.getinfo(pycurl.OS_ERRNO)))
                seconds = float(curl.getinfo(pycurl.TOTAL_TIME))
                self._finish(curl)
                done(transfer.index, Outcome(0, b"", error, seconds))
            if not queued:
                return

    def _finish(self, curl: pycurl.Curl) -> None:
        self._running.pop(curl, None)
        self._multi.remove_handle(curl)
        curl.setopt(pycurl.WRITEFUNCTION, _discard)  # drop the transfer's buffers with it
        self._idle.append(curl)

    def close(self) -> None:
        """Close every connection and handle (no batch may be running)."""
        for curl in self._idle:
            curl.close()
        self._idle.clear()
        self._multi.close()
        self._poll.close()
        self._wake_r.close()
        self._wake_w.close()


def _discard(data: bytes) -> None:
    return None


def _reason(code: int, message: str, transfer: _Transfer, os_errno: int) -> str:
    """A failed transfer's one-line reason, in the words the collector has always used."""
    get = transfer.get
    if code == pycurl.E_OPERATION_TIMEDOUT:
        return f"timed out after {get.timeout_s:g}s"
    if code == pycurl.E_COULDNT_CONNECT:
        return "connection refused" if os_errno == _ERRNO_REFUSED else f"cannot connect ({_short(message)})"
    if code == pycurl.E_COULDNT_RESOLVE_HOST:
        return "cannot resolve the host"
    if code == pycurl.E_GOT_NOTHING:
        return "the target closed the connection without answering"
    if code == pycurl.E_FILESIZE_EXCEEDED or (code == pycurl.E_WRITE_ERROR and transfer.over):
        return f"response is larger than the limit of {get.max_bytes} bytes"
    if code == pycurl.E_PARTIAL_FILE:
        return f"body is truncated: {transfer.size} bytes received, fewer than its Content-Length"
    if code == pycurl.E_BAD_CONTENT_ENCODING:
        return "sent a corrupt gzip body"
    if code in (pycurl.E_PEER_FAILED_VERIFICATION, pycurl.E_SSL_CONNECT_ERROR, pycurl.E_SSL_CACERT_BADFILE):
        return f"TLS failed: {_short(message)}"
    return _short(message) or f"transfer failed (libcurl error {code})"


def _short(message: str) -> str:
    return " ".join(message.split())[:200]
