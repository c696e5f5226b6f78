"""Misbehaving notification receivers on 127.0.0.1, for the delivery worker's tests.

``hanging_receiver``: accepts connections (the kernel's backlog does) and never answers. ``DripReceiver``: answers
one byte at a time, slowly, forever. ``FlakyReceiver``: a webhook that plays a script of statuses, then 200, and
records every request with the status it got. ``answering_receiver``: answers every request with one status and body.
``recording_receiver``: answers as Slack does and records every JSON body.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@contextmanager
def hanging_receiver() -> Iterator[str]:
    """A URL whose server takes the request and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)  # never accepted: connections wait in the backlog, the request goes unread
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/hook"


class _Quiet(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients that give up are expected."""


@contextmanager
def serve(handler: type[BaseHTTPRequestHandler], state: Any = None) -> Iterator[str]:
    server = _Quiet(("127.0.0.1", 0), handler)
    server.state = state  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    finally:
        server.shutdown()
        server.server_close()


class _Drip(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        try:
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" * 1000:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.2)
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@contextmanager
def drip_receiver() -> Iterator[str]:
    with serve(_Drip) as url:
        yield url


@dataclass
class Received:
    group_key: str
    status: str  # the notification's status: firing or resolved
    answered: int  # the HTTP status the receiver gave it
    at: float


@dataclass
class FlakyState:
    script: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def accepted(self) -> list[Received]:
        with self.lock:
            return [r for r in self.received if r.answered == 200]

    def last_accepted(self) -> dict[str, str]:
        """group key -> the status of the last notification accepted for it."""
        return {r.group_key: r.status for r in self.accepted()}


class _Flaky(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        state: FlakyState = self.server.state  # type: ignore[attr-defined]
        doc = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        with state.lock:
            status, headers = state.script.pop(0) if state.script else (200, {})
            state.received.append(Received(doc["groupKey"], doc["status"], status, time.time()))
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@contextmanager
def flaky_receiver(script: list[tuple[int, dict[str, str]]]) -> Iterator[tuple[str, FlakyState]]:
    state = FlakyState(script=list(script))
    with serve(_Flaky, state) as url:
        yield url, state


class _Answer(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        status, body = self.server.state  # type: ignore[attr-defined]
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@contextmanager
def answering_receiver(status: int, body: bytes) -> Iterator[str]:
    """A URL whose server answers every POST with ``status`` and ``body``."""
    with serve(_Answer, (status, body)) as url:
        yield url


@dataclass
class Recorded:
    bodies: list[Any] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def all(self) -> list[Any]:
        with self.lock:
            return list(self.bodies)


class _Record(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        state: Recorded = self.server.state  # type: ignore[attr-defined]
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        with state.lock:
            state.bodies.append(body)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@contextmanager
def recording_receiver() -> Iterator[tuple[str, Recorded]]:
    """A URL that accepts every POST as Slack does (200, ``ok``) and records each JSON body."""
    state = Recorded()
    with serve(_Record, state) as url:
        yield url, state
