"""Reading one small kernel attribute file (sysfs, procfs, cgroupfs) without ever raising.

Every fabric and host reader goes through :class:`AttributeReader`: a file that does not exist is simply unknown
(``None``, not an error: which attributes exist varies by driver and kernel); a file that exists but cannot be
read, or holds something that does not parse, is ``None`` *and* one count under ``<prefix>_read_error``,
``<prefix>_permission_denied`` or ``<prefix>_malformed`` in the reader's cumulative error counts, whose first
occurrence of each reason is logged once.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Mapping
from typing import Final

from gpulens.logutil import ErrorCounter

logger = logging.getLogger(__name__)

_MAX_READ_BYTES: Final = 64 * 1024  # sysfs attributes are at most a page; /proc/stat grows with the CPU count
_OPEN_FLAGS: Final = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO planted in a fixture tree must not hang


class AttributeReader:
    """Reads attribute files and counts what goes wrong, by reason, under one prefix (``ib``, ``host``, ...)."""

    def __init__(self, prefix: str, errors: ErrorCounter | None = None) -> None:
        self.prefix = prefix
        self._errors = errors if errors is not None else ErrorCounter(logger)

    @property
    def errors(self) -> Mapping[str, int]:
        """Cumulative failure counts by reason."""
        return self._errors.snapshot()

    def count(self, reason: str, message: str, *args: object, level: int = logging.WARNING) -> None:
        """Count one ``<prefix>_<reason>``; the first of each reason is logged."""
        self._errors.count(f"{self.prefix}_{reason}", message, *args, level=level)

    def malformed(self, path: str, expected: str) -> None:
        self.count("malformed", "malformed %s: expected %s", path, expected)

    def text(self, path: str, *, missing_ok: bool = True) -> str | None:
        """The file's text, whitespace-stripped; ``None`` when missing (counted unless ``missing_ok``) or unreadable."""
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except FileNotFoundError:
            if not missing_ok:
                self.count("missing", "expected file %s is missing", path, level=logging.DEBUG)
            return None
        except OSError as exc:
            self._count_os_error(path, exc)
            return None
        try:
            data = os.read(fd, _MAX_READ_BYTES)
        except OSError as exc:
            # EINVAL/EOPNOTSUPP/EIO: the driver refused the attribute (e.g. a counter the HCA's PMA lacks)
            self._count_os_error(path, exc)
            return None
        finally:
            os.close(fd)
        return data.decode("utf-8", errors="replace").strip()

    def integer(self, path: str, *, signed: bool = False) -> int | None:
        """A decimal integer file (a counter: non-negative unless ``signed``); ``None`` when missing or unreadable."""
        text = self.text(path)
        if text is None:
            return None
        digits = text[1:] if signed and text.startswith("-") else text
        if digits.isdigit() and digits.isascii():
            return int(text)
        if text.startswith("N/A"):  # "N/A (no PMA)": the port's management agent does not provide this counter
            self.count("unavailable", "counter %s is not available: %r", path, text, level=logging.INFO)
            return None
        self.malformed(path, "an integer" if signed else "a non-negative integer")
        return None

    def _count_os_error(self, path: str, exc: OSError) -> None:
        if isinstance(exc, PermissionError):
            self.count("permission_denied", "cannot read %s: %s", path, exc)
        elif exc.errno in (errno.EINVAL, errno.EOPNOTSUPP, errno.EIO, errno.ENODATA):
            self.count("unavailable", "the driver refused %s: %s", path, exc, level=logging.INFO)
        else:
            self.count("read_error", "cannot read %s: %s", path, exc)
