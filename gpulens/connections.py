"""Bounded connection handling for ``gpulens.httpserver``: a fixed pool of worker threads, idle sockets in a
selector.

A connection holds a worker only while a request is being read and answered, so opening connections and sending
nothing makes no threads. Between requests a keep-alive connection waits in one selector thread, and is handed to
the workers, through a queue, when it has bytes to read; a connection idle for ``idle_timeout_s`` is closed, and
when ``max_connections`` are open the longest-idle one makes room for a new one. On plain HTTP the selector also
reads the request head, so half a request holds no worker either; over TLS the worker reads it. A request that
arrives while every worker is busy waits in the queue. Reads inside a request time out after ``read_timeout_s``.
Threads: the accept loop, the selector and ``workers``, however many sockets.
"""

from __future__ import annotations

import contextlib
import io
import logging
import queue
import select
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_WORKERS = 32
DEFAULT_MAX_CONNECTIONS = 1024
DEFAULT_IDLE_TIMEOUT_S = 120.0
DEFAULT_READ_TIMEOUT_S = 30.0
LINGER_S = 0.001  # how long a worker waits for a keep-alive client's next request before handing it to the selector
MAX_HEAD_BYTES = 65536  # http.server's own limit on a header line; a longer head is its to refuse


class Connection:
    """One client connection and the request handler that lives as long as it (so its read buffer survives).

    ``pending``: bytes the selector read before handing the connection over (a plain-HTTP request head is read
    whole in the selector, so a client that sends half a request holds no worker); ``reader()`` serves them first.
    """

    def __init__(self, sock: socket.socket, address: Any, handler: Any) -> None:
        self.sock = sock
        self.address = address
        self.handler = handler
        self.idle_since = time.monotonic()
        self.pending = bytearray()

    def reader(self) -> io.BufferedReader:
        """The connection's input stream for a request handler: the pending bytes, then the socket."""
        return io.BufferedReader(_PendingThenSocket(self))

    def head_complete(self) -> bool:
        return b"\r\n\r\n" in self.pending or b"\n\n" in self.pending or len(self.pending) >= MAX_HEAD_BYTES

    def has_buffered_input(self, read_timeout_s: float) -> bool:
        """True if the next request's bytes are already in user space (pipelined; TLS-decrypted), where the
        selector cannot see them."""
        if isinstance(self.sock, ssl.SSLSocket) and self.sock.pending():
            return True
        rfile = getattr(self.handler, "rfile", None)
        if rfile is None or not hasattr(rfile, "peek"):
            return False
        self.sock.setblocking(False)
        try:
            return bool(rfile.peek(1))
        except (OSError, ValueError):
            return False  # nothing buffered and nothing waiting (or the socket is closed)
        finally:
            with contextlib.suppress(OSError):
                self.sock.settimeout(read_timeout_s)


def _age(connection: Connection) -> float:
    return connection.idle_since


def _sends_soon(sock: socket.socket) -> bool:
    """Whether the client sends its next request within ``LINGER_S`` of our answer: a collector scraping many nodes
    over one keep-alive connection does, and then the request skips the trip through the selector."""
    try:
        readable, _, _ = select.select([sock], [], [], LINGER_S)
    except (OSError, ValueError):
        return False
    return bool(readable)


class _PendingThenSocket(io.RawIOBase):
    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        pending = self._connection.pending
        if pending:
            n = min(len(buffer), len(pending))
            buffer[:n] = pending[:n]
            del pending[:n]
            return n
        try:
            return self._connection.sock.recv_into(buffer)
        except BlockingIOError:
            return None  # non-blocking and nothing there (``has_buffered_input``)


class ConnectionPool:
    """Serves connections with ``workers`` threads. ``serve_one(connection)`` answers one request and says whether
    to keep the connection open; ``close(connection)`` closes it."""

    def __init__(
        self,
        serve_one: Callable[[Connection], bool],
        close: Callable[[Connection], None],
        *,
        workers: int = DEFAULT_WORKERS,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
        name: str = "gpulens-http",
    ) -> None:
        self._serve_one = serve_one
        self._close = close
        self._max = max_connections
        self._idle_timeout = idle_timeout_s
        self.read_timeout_s = read_timeout_s
        self._ready: queue.Queue[Connection | None] = queue.Queue()
        self._returned: queue.SimpleQueue[Connection] = queue.SimpleQueue()
        self._selector = selectors.DefaultSelector()
        self._idle: dict[int, Connection] = {}  # id -> connection waiting in the selector (selector thread only)
        self._open = 0
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._next_expiry = 0.0
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._threads = [threading.Thread(target=self._select_loop, name=f"{name}-idle", daemon=True)]
        self._threads += [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(max(1, workers))
        ]
        for thread in self._threads:
            thread.start()

    @property
    def open_connections(self) -> int:
        with self._lock:
            return self._open

    def add(self, connection: Connection) -> None:
        """A new connection: it waits in the selector until it sends something."""
        with self._lock:
            self._open += 1
        self._give_back(connection)

    def _give_back(self, connection: Connection) -> None:
        connection.idle_since = time.monotonic()
        self._returned.put(connection)
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def _drop(self, connection: Connection) -> None:
        with self._lock:
            self._open -= 1
        try:
            self._close(connection)
        except Exception:  # a socket already broken: nothing more to do
            log.debug("closing a connection failed", exc_info=True)

    # -- the selector thread ------------------------------------------------------------------------------------

    def _select_loop(self) -> None:
        while not self._closed.is_set():
            for key, _ in self._selector.select(timeout=1.0):
                if key.data is None:
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(4096)
                    continue
                connection: Connection = key.data
                if not isinstance(connection.sock, ssl.SSLSocket) and not self._read_head(connection):
                    continue  # half a request head: it waits here, not on a worker
                self._unwatch(connection)
                self._ready.put(connection)
            self._watch_returned()
            self._expire_idle()
        for connection in list(self._idle.values()):
            self._unwatch(connection)
            self._drop(connection)

    def _read_head(self, connection: Connection) -> bool:
        """Read what a plain-HTTP connection sent; True once a request head is whole (or the client left)."""
        try:
            connection.sock.setblocking(False)
            data = connection.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True  # broken: the worker's read finds out and closes it
        finally:
            with contextlib.suppress(OSError):
                connection.sock.settimeout(self.read_timeout_s)
        if not data:
            return True  # the client closed: the worker reads EOF and closes it
        connection.pending += data
        return connection.head_complete()

    def _watch_returned(self) -> None:
        while True:
            try:
                connection = self._returned.get_nowait()
            except queue.Empty:
                return
            try:
                self._selector.register(connection.sock, selectors.EVENT_READ, connection)
            except (OSError, ValueError):
                self._drop(connection)  # closed meanwhile
                continue
            self._idle[id(connection)] = connection

    def _unwatch(self, connection: Connection) -> None:
        self._idle.pop(id(connection), None)
        with contextlib.suppress(KeyError, OSError, ValueError):
            self._selector.unregister(connection.sock)

    def _expire_idle(self) -> None:
        now = time.monotonic()
        excess = self.open_connections - self._max
        if excess <= 0 and now < self._next_expiry:
            return
        self._next_expiry = now + min(1.0, self._idle_timeout / 2)
        expired = [c for c in self._idle.values() if now - c.idle_since >= self._idle_timeout]
        if excess > len(expired):  # over the limit: the longest-idle make room
            rest = sorted((c for c in self._idle.values() if now - c.idle_since < self._idle_timeout), key=_age)
            expired += rest[: excess - len(expired)]
        for connection in expired:
            self._unwatch(connection)
            self._drop(connection)

    # -- the workers ----------------------------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            connection = self._ready.get()
            if connection is None:
                return
            try:
                keep = self._serve_one(connection)
            except Exception:
                log.exception("serving a request failed")
                keep = False
            if not keep or self._closed.is_set():
                self._drop(connection)
            elif connection.has_buffered_input(self.read_timeout_s) or _sends_soon(connection.sock):
                self._ready.put(connection)  # the next request is here already (a client scraping back to back)
            else:
                self._give_back(connection)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the threads and close every connection."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")
        for _ in self._threads[1:]:
            self._ready.put(None)
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        while True:  # connections that were queued for a worker, or on their way back, when the threads stopped
            try:
                connection = self._ready.get_nowait()
            except queue.Empty:
                break
            if connection is not None:
                self._drop(connection)
        while True:
            try:
                self._drop(self._returned.get_nowait())
            except queue.Empty:
                break
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()
