"""A whole-request deadline for a notification's HTTP request, and a way to cut the requests of a thread short.

A socket timeout bounds each read, not the request: a receiver that drips its answer a byte at a time never trips
it. ``SendGuard`` records the sockets its thread opens (through ``WatchedHTTPHandler``/``WatchedHTTPSHandler``) and
shuts them down when its deadline passes, or when ``abort_sends(thread)`` asks it to (the notification worker
stopping), so the blocked read returns at once and the send fails as a retryable timeout.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import socket
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_lock = threading.Lock()
_guards: dict[int, SendGuard] = {}  # thread ident -> the guard of the send running on it


class SendGuard:
    """The sockets of one send, shut down if the deadline passes first."""

    def __init__(self) -> None:
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self.fired = False

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            if self.fired:
                _shutdown(sock)
            self._sockets.append(sock)

    def fire(self) -> None:
        with self._lock:
            self.fired = True
            for sock in self._sockets:
                _shutdown(sock)


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed
        sock.shutdown(socket.SHUT_RDWR)


@contextmanager
def guarded(deadline_s: float) -> Iterator[SendGuard]:
    """Run one send on this thread with a whole-request deadline; ``guard.fired`` says whether it cut it short."""
    guard = SendGuard()
    ident = threading.get_ident()
    timer = threading.Timer(deadline_s, guard.fire)
    timer.daemon = True
    with _lock:
        _guards[ident] = guard
    timer.start()
    try:
        yield guard
    finally:
        timer.cancel()
        with _lock:
            if _guards.get(ident) is guard:
                del _guards[ident]


def abort_sends(thread: threading.Thread) -> None:
    """Cut short the send running on ``thread``, if any."""
    with _lock:
        guard = _guards.get(thread.ident or -1)
    if guard is not None:
        guard.fire()


def _register(sock: socket.socket | None) -> None:
    with _lock:
        guard = _guards.get(threading.get_ident())
    if guard is not None and sock is not None:
        guard.add(sock)


class _WatchedHTTPConnection(http.client.HTTPConnection):
    def connect(self) -> None:
        super().connect()
        _register(self.sock)


class _WatchedHTTPSConnection(http.client.HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        _register(self.sock)


class WatchedHTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: Any) -> http.client.HTTPResponse:
        return self.do_open(_WatchedHTTPConnection, req)


class WatchedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, context: Any = None) -> None:
        super().__init__(context=context)
        self._watched_context = context

    def https_open(self, req: Any) -> http.client.HTTPResponse:
        connection = functools.partial(_WatchedHTTPSConnection, context=self._watched_context)
        return self.do_open(connection, req)
