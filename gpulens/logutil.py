"""Counting failures and logging each kind once: a failing component must not flood the log."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping


class ErrorCounter:
    """Thread-safe cumulative counts of failures by reason; the first of each reason is logged."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def count(self, reason: str, message: str | None = None, *args: object, level: int = logging.WARNING) -> None:
        """Count one failure of ``reason``; log ``message % args`` the first time this reason occurs."""
        with self._lock:
            first = reason not in self._counts
            self._counts[reason] = self._counts.get(reason, 0) + 1
        if first and message is not None:
            self._logger.log(level, message, *args)

    def snapshot(self) -> Mapping[str, int]:
        with self._lock:
            return dict(self._counts)

    def __getitem__(self, reason: str) -> int:
        with self._lock:
            return self._counts.get(reason, 0)


class LogOnce:
    """Logs a message once per key (e.g. a missing NVML function), then stays quiet."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, key: str, message: str, *args: object, level: int = logging.WARNING) -> bool:
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
        self._logger.log(level, message, *args)
        return True
