"""Following the kernel log on its own thread: ``/dev/kmsg`` from its end, or a file of lines (``--kernel-log``)
from its start, then whatever is appended. Each line goes through the parser (``gpulens.kernlog``) into the XID
ledger (``gpulens.exporter.xidledger``); the GPU readings never wait on it.

- ``/dev/kmsg`` (any character device): the reader seeks to the end at start, so the ring's past is never replayed
  on a restart; each ``read`` returns one record. Records overwritten before they were read (``EPIPE``) are
  skipped and counted as ``kernel_log_overrun``.
- A file (or a FIFO): read whole once, then followed like ``tail -F``: a file that shrinks or is replaced (another
  inode) is read again from its start. A last line without its line feed waits for it (at most
  ``MAX_LINE_BYTES``). Where the ledger has a state directory, how far the file was read is kept there
  (``POSITION_FILE``): a restart reads the file whole again (the counters start from zero), but the lines an
  earlier run read are not new occurrences for escalation.
- Bounds: a line longer than ``MAX_LINE_BYTES`` is cut there and the rest skipped up to its line feed
  (``kernel_log_line_too_long``); the parser and the ledger bound their own state. Memory does not grow with the
  log's size.
- A record the parser holds open (the three-line fallen-off message) ends when the log has been quiet for
  ``QUIET_FLUSH_S``.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import select
import stat
import threading
import time
from collections.abc import Mapping
from typing import Final

from gpulens.exporter.xidledger import XidLedger
from gpulens.kernlog import KernelLogParser
from gpulens.logutil import ErrorCounter

log = logging.getLogger(__name__)

KMSG: Final = "/dev/kmsg"
MAX_LINE_BYTES: Final = 4096
POLL_S: Final = 0.25
QUIET_FLUSH_S: Final = 1.0
READ_CHUNK: Final = 64 * 1024
POSITION_FILE: Final = "kernel-log-position.json"  # where a --kernel-log file was read to (its inode, offset)


def default_kernel_log() -> str | None:
    """``/dev/kmsg`` where this is Linux and it can be opened for reading; None elsewhere."""
    try:
        fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    os.close(fd)
    return KMSG


class KernelLogFollower:
    """Reads ``path`` on a daemon thread into ``ledger``. ``errors()`` gives its failures by reason."""

    def __init__(self, path: str, ledger: XidLedger, *, poll_s: float = POLL_S) -> None:
        self._path = path
        self._ledger = ledger
        self._poll_s = poll_s
        self._parser = KernelLogParser()
        self._errors = ErrorCounter(log)
        self._stop = threading.Event()
        self._lines = 0
        self._consumed = 0  # a file: the offset of the first byte not yet fed
        self._replay_until = 0  # a file: where an earlier run stopped reading it (same inode)
        self._inode = 0
        self._saved: tuple[int, int] | None = None
        state = ledger.state_dir
        self._position_path = state / POSITION_FILE if state is not None else None
        self._thread = threading.Thread(target=self._run, name="gpulens-kernel-log", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)
        if not self._thread.is_alive() and self._inode:
            self._save_offset()

    @property
    def lines(self) -> int:
        return self._lines

    def errors(self) -> Mapping[str, int]:
        return self._errors.snapshot()

    def feed(self, line: bytes, *, replayed: bool = False) -> None:
        """One line (without its line feed), as the thread reads it; tests call it directly. ``replayed``: an
        earlier run already read it (counted again, but not a new occurrence)."""
        self._lines += 1
        for record in self._parser.feed(line.decode("utf-8", "replace")):
            self._ledger.record(record, replayed=replayed)

    def flush(self) -> None:
        for record in self._parser.flush():
            self._ledger.record(record)

    # -- the thread ---------------------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                mode = os.stat(self._path).st_mode
                if stat.S_ISCHR(mode):
                    self._follow_kmsg()
                else:
                    self._follow_file(stat.S_ISFIFO(mode))
            except OSError as exc:
                self._errors.count("kernel_log_unreadable", "cannot read the kernel log %s: %s", self._path, exc)
            except Exception as exc:  # noqa: BLE001 - the kernel log must never take the exporter down
                self._errors.count("kernel_log_failed", "kernel log reader failed: %s", exc)
            self._stop.wait(5.0)  # retry a log that went away or failed

    def _follow_kmsg(self) -> None:
        fd = os.open(self._path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            os.lseek(fd, 0, os.SEEK_END)  # only what the kernel logs from now on
            self.read_records(fd)
        finally:
            os.close(fd)

    def read_records(self, fd: int) -> None:
        """Read ``/dev/kmsg`` records from ``fd`` (non-blocking; one record per ``read``) until stopped or the far
        end closes it."""
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        quiet_since = time.monotonic()
        while not self._stop.is_set():
            if not poller.poll(self._poll_s * 1000):
                if time.monotonic() - quiet_since > QUIET_FLUSH_S:
                    self.flush()
                continue
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                continue
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # the ring overwrote records before we read them
                    self._errors.count("kernel_log_overrun", "kernel log records were overwritten unread")
                    continue
                raise
            if not record:
                self.flush()
                return
            quiet_since = time.monotonic()
            self.feed(record.split(b"\n", 1)[0][:MAX_LINE_BYTES])  # its dictionary lines follow the first

    def _follow_file(self, fifo: bool) -> None:
        with open(self._path, "rb", buffering=0) as f:
            self._inode = os.fstat(f.fileno()).st_ino
            self._consumed = 0
            self._replay_until = 0 if fifo else self._saved_offset()
            partial = b""
            skipping = False
            quiet_since = time.monotonic()
            while not self._stop.is_set():
                chunk = f.read(READ_CHUNK)
                if chunk:
                    quiet_since = time.monotonic()
                    partial, skipping = self._lines_of(partial + chunk, skipping)
                    continue
                if time.monotonic() - quiet_since > QUIET_FLUSH_S:
                    self.flush()
                    if not fifo:
                        self._save_offset()
                if fifo and chunk == b"":
                    return  # the writer closed it: reopen, wait for the next
                self._stop.wait(self._poll_s)
                try:
                    now = os.stat(self._path)
                except FileNotFoundError:
                    continue  # rotated away; its successor is read when it appears
                if now.st_ino != self._inode or now.st_size < f.tell():
                    return  # replaced or truncated: read the new one from its start

    def _lines_of(self, data: bytes, skipping: bool) -> tuple[bytes, bool]:
        """Feed each complete line of ``data`` (which starts at file offset ``_consumed``); return what is left (a
        partial line) and whether the rest of an over-long line is being skipped."""
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                break
            if not skipping:
                if end - start > MAX_LINE_BYTES:
                    self._too_long()
                replayed = self._consumed + end < self._replay_until
                self.feed(data[start : min(end, start + MAX_LINE_BYTES)], replayed=replayed)
            skipping = False
            start = end + 1
        self._consumed += start
        rest = data[start:]
        if len(rest) > MAX_LINE_BYTES:
            if not skipping:
                self._too_long()
                self.feed(rest[:MAX_LINE_BYTES], replayed=self._consumed < self._replay_until)
            self._consumed += len(rest)
            return b"", True
        return rest, skipping

    # -- where a file was read to, across restarts ----------------------------------------------------------------

    def _saved_offset(self) -> int:
        """Where an earlier run stopped reading this file (same path and inode), or 0."""
        if self._position_path is None:
            return 0
        try:
            doc = json.loads(self._position_path.read_text())
            if doc.get("path") == os.path.abspath(self._path) and int(doc["inode"]) == self._inode:
                return int(doc["offset"])
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            pass
        return 0

    def _save_offset(self) -> None:
        if self._position_path is None or self._saved == (self._inode, self._consumed):
            return
        doc = {"path": os.path.abspath(self._path), "inode": self._inode, "offset": self._consumed}
        try:
            self._position_path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self._position_path.with_suffix(".tmp")
            temporary.write_text(json.dumps(doc) + "\n")
            os.replace(temporary, self._position_path)
            self._saved = (self._inode, self._consumed)
        except OSError as exc:
            self._errors.count("kernel_log_position", "cannot keep the kernel log position: %s", exc)

    def _too_long(self) -> None:
        self._errors.count("kernel_log_line_too_long", "a kernel log line over %d bytes was cut", MAX_LINE_BYTES)
