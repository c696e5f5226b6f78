"""The RAS client's conversation: one status query over NCCL's RAS client protocol, bounded in bytes and time.

``CLIENT PROTOCOL 2`` (answered ``SERVER PROTOCOL n``), ``TIMEOUT 5`` (``OK``), ``SET FORMAT json`` (``OK`` since NCCL
2.28.7; older versions answer ``ERROR: Unknown command ...`` and the report comes as text), then ``VERBOSE STATUS``
and everything up to the server's close. The client only connects: it never binds the RAS port, so it cannot take
the port from a job that starts later. Whatever answers is untrusted: a reply line over 1 KiB, an answer over
``max_bytes``, a server slower than the deadline or one that never closes ends the query with ``RasQueryError``.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from gpulens.netaddr import parse_listen

PROTOCOL: Final = 2
RAS_TIMEOUT_S: Final = 5  # what RAS waits for each process's part of the answer
GRACE_S: Final = 3.0  # beyond RAS's own timeout, for the gathering and the transfer
MAX_BYTES: Final = 8 << 20
MAX_LINE: Final = 1024
DEFAULT_ADDR: Final = "127.0.0.1:28028"


class RasQueryError(Exception):
    """The query got no whole report; the message is one line. ``absent``: nothing listens at the address, which is
    how a node looks whose GPU processes run without NCCL's RAS (inference, single-GPU work): no failure."""

    def __init__(self, message: str, *, absent: bool = False) -> None:
        super().__init__(message)
        self.absent = absent


@dataclass(frozen=True)
class RasAnswer:
    text: str
    format: str  # "json" or "text"
    seconds: float


def parse_addr(addr: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``); raises ValueError with the reason."""
    return parse_listen(addr)


class _Conversation:
    def __init__(self, sock: socket.socket, deadline: float, max_bytes: int, now: Callable[[], float]) -> None:
        self._sock = sock
        self._deadline = deadline
        self._max = max_bytes
        self._now = now
        self._buffer = bytearray()
        self._received = 0
        self._closed = False

    def _recv(self) -> bool:
        left = self._deadline - self._now()
        if left <= 0:
            raise RasQueryError("RAS did not finish its answer in time")
        self._sock.settimeout(left)
        try:
            chunk = self._sock.recv(65536)
        except TimeoutError:
            raise RasQueryError("RAS did not finish its answer in time") from None
        if not chunk:
            self._closed = True
            return False
        self._received += len(chunk)
        if self._received > self._max:
            raise RasQueryError(f"RAS answered more than {self._max} bytes")
        self._buffer += chunk
        return True

    def send(self, line: str) -> None:
        self._sock.settimeout(max(0.001, self._deadline - self._now()))
        self._sock.sendall(line.encode("ascii") + b"\n")

    def line(self) -> str:
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                raw = bytes(self._buffer[:end])
                del self._buffer[: end + 1]
                return raw.decode("utf-8", "replace").rstrip("\r")
            if len(self._buffer) > MAX_LINE:
                raise RasQueryError(f"RAS answered a line over {MAX_LINE} bytes")
            if not self._recv():
                raise RasQueryError("RAS closed the connection before answering")

    def rest(self) -> str:
        while self._recv():
            pass
        return self._buffer.decode("utf-8", "replace")  # no bytes copy of up to max_bytes first


def query_status(
    addr: str,
    *,
    timeout_s: int = RAS_TIMEOUT_S,
    max_bytes: int = MAX_BYTES,
    verbose: bool = True,
    want_json: bool = True,
    grace_s: float = GRACE_S,
    now: Callable[[], float] = time.monotonic,
) -> RasAnswer:
    """One status report from the RAS server at ``addr``. Raises ``RasQueryError`` (and only that)."""
    try:
        host, port = parse_addr(addr)
    except ValueError as exc:
        raise RasQueryError(f"bad RAS address {addr!r}: {exc}") from None
    start = now()
    deadline = start + timeout_s + grace_s
    try:
        with socket.create_connection((host, port), timeout=min(1.0, timeout_s + grace_s)) as sock:
            talk = _Conversation(sock, deadline, max_bytes, now)
            talk.send(f"CLIENT PROTOCOL {PROTOCOL}")
            reply = talk.line()
            if not reply.upper().startswith("SERVER PROTOCOL "):
                raise RasQueryError(f"not a RAS server (it answered {reply[:60]!r})")
            talk.send(f"TIMEOUT {timeout_s}")
            reply = talk.line()
            if reply != "OK":
                raise RasQueryError(f"RAS refused the timeout: {reply[:80]!r}")
            fmt = "text"
            if want_json:
                talk.send("SET FORMAT json")
                reply = talk.line()
                if reply == "OK":
                    fmt = "json"
                elif not reply.startswith("ERROR"):
                    raise RasQueryError(f"unexpected answer to SET FORMAT: {reply[:80]!r}")
            talk.send("VERBOSE STATUS" if verbose else "STATUS")
            text = talk.rest()
    except ConnectionRefusedError:
        raise RasQueryError(f"nothing listens at {addr} (no NCCL job with RAS on this node)", absent=True) from None
    except TimeoutError:
        raise RasQueryError(f"RAS at {addr} did not answer in time") from None
    except (OSError, UnicodeError) as exc:
        raise RasQueryError(f"RAS at {addr}: {exc}") from None
    if not text.strip():
        raise RasQueryError("RAS closed the connection without a report")
    return RasAnswer(text, fmt, now() - start)
