"""NCCL RAS's event stream (``MONITOR``, NCCL 2.29 and later): the peers RAS finds dead or unreachable, pushed as
they happen, so that a dead rank is named without waiting for this node's status turn.

One connection per RAS endpoint: ``CLIENT PROTOCOL 2``, ``SET FORMAT json`` (text where refused), then
``MONITOR lifecycle`` (answered ``OK``) and events until the server closes. A text event is one line,
``[YYYY-MM-DD HH:MM:SS] PEER_DEAD: <peer> <details>``; a JSON event a multi-line object with ``event`` and ``peer``
(``host``, ``pid``, ``cuda_devs``, ``nvml_devs``, or ``addr`` alone). ``PEER_DEAD``, ``PEER_TIMEOUT_DEAD`` and
``PEER_UNRESPONSIVE`` (RAS's own connection to the process keeps failing) mark the peer's ranks dead; ``PEER_RECOVERED``
clears them; other events are read and ignored. The stream is untrusted: a line or object over ``MAX_LINE`` bytes
ends the connection, events beyond ``MAX_EVENTS_PER_S`` are dropped, at most ``MAX_PEERS`` peers are remembered, and a
connection that fails or ends is tried again after a backoff (``BACKOFF_S`` doubling to ``MAX_BACKOFF_S``); every
failure is counted by kind and logged once. While no stream is open the status queries in turns go on as before.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Final, Protocol

import orjson

from gpulens.clock import Clock
from gpulens.exporter.ncclrasclient import PROTOCOL, parse_addr
from gpulens.logutil import ErrorCounter
from gpulens.ncclmodel import RANK_DEAD, NcclRank

log = logging.getLogger(__name__)

MONITOR_SINCE: Final = (2, 29)
MAX_LINE: Final = 2048  # NCCL prints an event in at most 2,048 bytes
MAX_EVENTS_PER_S: Final = 100
MAX_PEERS: Final = 1024
BACKOFF_S: Final = 1.0
MAX_BACKOFF_S: Final = 60.0
DEAD_EVENTS: Final = frozenset({"PEER_DEAD", "PEER_TIMEOUT_DEAD", "PEER_UNRESPONSIVE"})
RECOVERED: Final = "PEER_RECOVERED"
_TEXT = re.compile(r"^\[[0-9: -]{19}\] ([A-Z_]{1,40}): ?(.*)$")
_PID = re.compile(r"\bpid[ :=]+(\d{1,10})", re.IGNORECASE)
_DEVS = re.compile(r"\bnvml_devs?[ :=]+\[?([\d, ]{1,200})", re.IGNORECASE)


def version_tuple(version: str) -> tuple[int, ...]:
    """``"2.29.2+cuda12.8"`` -> ``(2, 29, 2)``; missing or odd pieces count 0."""
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits[:6] or 0))
    return tuple(parts)


def speaks_monitor(version: str | None) -> bool:
    return version is not None and version_tuple(version) >= MONITOR_SINCE


@dataclass(frozen=True)
class MonitorEvent:
    event: str
    host: str | None = None
    pid: int | None = None
    nvml_devs: tuple[int, ...] = ()


class MonitorError(Exception):
    """The stream broke a bound or spoke no MONITOR; ``kind`` is the error counter's reason."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def parse_text_event(line: str) -> MonitorEvent:
    """One text event line; raises ``MonitorError`` for anything else. The peer is its first word (the port, where
    given, dropped), the pid and NVML devices taken where the line names them."""
    m = _TEXT.match(line)
    if m is None:
        raise MonitorError("nccl_monitor_malformed", f"RAS MONITOR sent a line that is no event: {line[:60]!r}")
    rest = m.group(2)
    word = rest.split(" ", 1)[0] if rest else ""
    host = _host(word) if word else None
    pid = _PID.search(rest)
    devs = _DEVS.search(rest)
    nvml = tuple(int(d) for d in re.findall(r"\d+", devs.group(1))[:64]) if devs else ()
    return MonitorEvent(m.group(1), host, int(pid.group(1)) if pid else None, nvml)


def parse_json_event(text: str) -> MonitorEvent:
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise MonitorError("nccl_monitor_malformed", "RAS MONITOR sent an object that is not JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("event"), str):
        raise MonitorError("nccl_monitor_malformed", "RAS MONITOR sent a JSON event without its name")
    peer = doc.get("peer")
    peer = peer if isinstance(peer, dict) else {}
    host = peer.get("host") if isinstance(peer.get("host"), str) else None
    if host is None and isinstance(peer.get("addr"), str):
        host = _host(peer["addr"])
    pid = peer.get("pid") if isinstance(peer.get("pid"), int) and not isinstance(peer.get("pid"), bool) else None
    devs = peer.get("nvml_devs")
    nvml = tuple(d for d in devs[:64] if isinstance(d, int)) if isinstance(devs, list) else ()
    return MonitorEvent(doc["event"][:40], host[:64] if host else None, pid, nvml)


def _host(addr: str) -> str:
    addr = addr[:64]
    if addr.startswith("["):
        return addr[1:].split("]", 1)[0]
    return addr.rsplit(":", 1)[0] if addr.count(":") == 1 else addr


class EventParser:
    """Bytes in, events out: text lines or JSON objects (a line starting ``{`` opens one, its braces balanced
    closes it), each at most ``MAX_LINE`` bytes."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._obj: list[str] = []
        self._obj_bytes = 0
        self._depth = 0

    def feed(self, data: bytes) -> list[MonitorEvent | MonitorError]:
        self._buffer += data
        out: list[MonitorEvent | MonitorError] = []
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                if len(self._buffer) + self._obj_bytes > MAX_LINE:
                    raise MonitorError("nccl_monitor_oversized", f"RAS MONITOR sent an event over {MAX_LINE} bytes")
                return out
            raw = bytes(self._buffer[:end])
            del self._buffer[: end + 1]
            line = raw.decode("utf-8", "replace").rstrip("\r")
            if self._obj or line.lstrip().startswith("{"):
                self._obj_bytes += len(raw) + 1
                if self._obj_bytes > MAX_LINE:
                    raise MonitorError("nccl_monitor_oversized", f"RAS MONITOR sent an event over {MAX_LINE} bytes")
                self._obj.append(line)
                self._depth += line.count("{") - line.count("}")
                if self._depth <= 0:
                    text = "\n".join(self._obj)
                    self._obj, self._obj_bytes, self._depth = [], 0, 0
                    out.append(_caught(parse_json_event, text))
            elif line.strip():
                out.append(_caught(parse_text_event, line))


def _caught(parse: Callable[[str], MonitorEvent], text: str) -> MonitorEvent | MonitorError:
    try:
        return parse(text)
    except MonitorError as exc:
        return exc


class Link(Protocol):
    """An open MONITOR stream: ``recv`` returns what arrived within ``timeout_s``: None for nothing yet, b"" once
    the stream ended."""

    def recv(self, timeout_s: float) -> bytes | None: ...

    def close(self) -> None: ...


class _SocketLink:
    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.pending = bytearray()  # read past the handshake's last line: the stream's first bytes

    def line(self) -> str:
        """One handshake answer line."""
        while b"\n" not in self.pending:
            if len(self.pending) > MAX_LINE:
                raise MonitorError("nccl_monitor_refused", f"RAS answered a line over {MAX_LINE} bytes")
            chunk = self._sock.recv(4096)
            if not chunk:
                raise MonitorError("nccl_monitor_refused", "RAS closed the connection before answering")
            self.pending += chunk
        raw, _, rest = bytes(self.pending).partition(b"\n")
        self.pending = bytearray(rest)
        return raw.decode("utf-8", "replace").strip()

    def recv(self, timeout_s: float) -> bytes | None:
        if self.pending:
            data, self.pending = bytes(self.pending), bytearray()
            return data
        self._sock.settimeout(max(timeout_s, 0.0))  # 0: only what has arrived
        try:
            return self._sock.recv(4096)
        except (TimeoutError, BlockingIOError):
            return None

    def close(self) -> None:
        self._sock.close()


def connect_monitor(addr: str, timeout_s: float = 5.0) -> Link:
    """Opens a MONITOR stream at ``addr``; raises ``MonitorError`` where RAS refuses or is absent."""
    try:
        host, port = parse_addr(addr)
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except (OSError, ValueError) as exc:
        raise MonitorError("nccl_monitor_unreachable", f"RAS MONITOR at {addr}: {exc}") from None
    link = _SocketLink(sock)
    try:
        sock.settimeout(timeout_s)
        for command, wanted in ((f"CLIENT PROTOCOL {PROTOCOL}", "SERVER PROTOCOL"), ("SET FORMAT json", None)):
            sock.sendall(command.encode() + b"\n")
            reply = link.line()
            if wanted and not reply.upper().startswith(wanted):
                raise MonitorError("nccl_monitor_refused", f"not a RAS server at {addr}: {reply[:60]!r}")
        sock.sendall(b"MONITOR lifecycle\n")
        reply = link.line()
        if reply != "OK":
            raise MonitorError("nccl_monitor_refused", f"RAS at {addr} refused MONITOR: {reply[:80]!r}")
        return link
    except MonitorError:
        sock.close()
        raise
    except OSError as exc:
        sock.close()
        raise MonitorError("nccl_monitor_unreachable", f"RAS MONITOR at {addr}: {exc}") from None


class Monitor:
    """One MONITOR stream and the peers it found dead: ``(host, pid)`` or ``(host, nvml device)`` -> since when."""

    def __init__(self, connect: Callable[[], Link], clock: Clock, errors: ErrorCounter) -> None:
        self._connect = connect
        self._clock = clock
        self._errors = errors
        self._lock = threading.Lock()
        self._link: Link | None = None
        self._parser = EventParser()
        self._retry_at = 0.0
        self._backoff = BACKOFF_S
        self._dead: dict[tuple[str, str, int], float] = {}  # (host, "pid"|"dev", number) -> since
        self._confirm = False
        self._second = -1
        self._in_second = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.events = 0  # events applied
        self.connections = 0  # streams opened

    @property
    def open(self) -> bool:
        return self._link is not None

    def start(self) -> None:
        """Reads the stream on a thread of its own (the live agent); ``poll`` reads it in the caller's."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="nccl-monitor", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._drop()

    def _loop(self) -> None:
        while not self._stop.is_set():
            if not self.poll(1.0):
                self._stop.wait(min(1.0, max(0.05, self._retry_at - self._clock.monotonic())))

    def poll(self, timeout_s: float = 0.0) -> bool:
        """Opens the stream when due and reads what arrived; False while waiting out a backoff."""
        if self._link is None:
            if self._clock.monotonic() < self._retry_at:
                return False
            try:
                self._link = self._connect()
            except MonitorError as exc:
                self._failed(exc)
                return False
            self._parser = EventParser()
            self.connections += 1
        try:
            data = self._link.recv(timeout_s)
            if data is None:
                return True
            if not data:
                raise MonitorError("nccl_monitor_ended", "RAS ended the MONITOR stream; status queries go on alone")
            for item in self._parser.feed(data):
                if isinstance(item, MonitorError):
                    self._errors.count(item.kind, str(item))
                else:
                    self._apply(item)
        except MonitorError as exc:
            self._drop()
            self._failed(exc)
        except OSError as exc:
            self._drop()
            self._failed(MonitorError("nccl_monitor_unreachable", f"RAS MONITOR: {exc}"))
        return True

    def _failed(self, exc: MonitorError) -> None:
        self._errors.count(exc.kind, str(exc))
        self._retry_at = self._clock.monotonic() + self._backoff
        self._backoff = min(MAX_BACKOFF_S, self._backoff * 2)

    def _drop(self) -> None:
        if self._link is not None:
            self._link.close()
            self._link = None

    def _apply(self, event: MonitorEvent) -> None:
        second = int(self._clock.monotonic())
        if second != self._second:
            self._second, self._in_second = second, 0
        self._in_second += 1
        if self._in_second > MAX_EVENTS_PER_S:
            self._errors.count("nccl_monitor_flood", f"RAS MONITOR sent over {MAX_EVENTS_PER_S} events a second")
            return
        if event.host is None or (event.pid is None and not event.nvml_devs):
            return  # a peer named by its RAS address alone maps to no rank
        keys = [(event.host, "pid", event.pid)] if event.pid is not None else []
        if event.pid is None:
            keys += [(event.host, "dev", d) for d in event.nvml_devs]
        self._backoff = BACKOFF_S  # a stream that delivers events is a good one
        self.events += 1
        with self._lock:
            if event.event in DEAD_EVENTS:
                for key in keys:
                    self._dead.setdefault(key, self._clock.now())
                while len(self._dead) > MAX_PEERS:
                    del self._dead[next(iter(self._dead))]
                self._confirm = True
            elif event.event == RECOVERED:
                for key in keys:
                    self._dead.pop(key, None)
                self._confirm = True

    def take_confirm(self) -> bool:
        """Whether an event changed the dead peers since last asked (the reader then queries status at once)."""
        with self._lock:
            confirm, self._confirm = self._confirm, False
            return confirm

    def mark(self, ranks: tuple[NcclRank, ...]) -> tuple[NcclRank, ...]:
        """The ranks, those of a peer the stream found dead marked ``dead``."""
        with self._lock:
            if not self._dead:
                return ranks
            dead = set(self._dead)
        out = []
        for r in ranks:
            hit = (r.host, "pid", r.pid) in dead or (r.gpu is not None and (r.host, "dev", r.gpu) in dead)
            out.append(r if not hit or r.state == RANK_DEAD else _dead(r))
        return tuple(out)


def _dead(rank: NcclRank) -> NcclRank:
    return replace(rank, state=RANK_DEAD, lag=None)
