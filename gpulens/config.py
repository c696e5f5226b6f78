"""Configuration helpers shared by every component: durations, typed errors with file/key/line, TOML locations."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


class ConfigError(ValueError):
    """A configuration problem, located as precisely as possible: ``file:line: key: message``."""

    def __init__(
        self, message: str, *, file: str | Path | None = None, key: str | None = None, line: int | None = None
    ):
        self.message = message
        self.file = str(file) if file is not None else None
        self.key = key
        self.line = line
        super().__init__(self._format())

    def _format(self) -> str:
        where = ""
        if self.file:
            where = self.file + (f":{self.line}" if self.line else "") + ": "
        elif self.line:
            where = f"line {self.line}: "
        key = f"{self.key}: " if self.key else ""
        return f"{where}{key}{self.message}"


def parse_duration(text: str | float | int) -> float:
    """``"90s"``, ``"5m"``, ``"1h30m"``, ``"250ms"`` or a number of seconds -> seconds. Raises ``ValueError``."""
    if isinstance(text, bool):
        raise ValueError(f"not a duration: {text!r}")
    if isinstance(text, int | float):
        if text < 0:
            raise ValueError(f"negative duration: {text!r}")
        return float(text)
    s = text.strip()
    if not s:
        raise ValueError("empty duration")
    try:
        value = float(s)
    except ValueError:
        pass
    else:
        if value < 0:
            raise ValueError(f"negative duration: {text!r}")
        return value
    pos = 0
    total = 0.0
    for m in _DURATION_PART.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        pos = m.end()
    if pos != len(s) or pos == 0:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30s, 5m, 1h30m)")
    return total


def format_duration(seconds: float) -> str:
    """A short human form: ``6m``, ``1h30m``, ``45s``."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        n, seconds = divmod(seconds, size)
        if n:
            parts.append(f"{n}{unit}")
    return "".join(parts[:2])


def parse_timestamp(text: str) -> float:
    """An RFC 3339 time (``2026-01-01T00:00:00Z``) -> seconds since the epoch."""
    try:
        dt = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"not an RFC 3339 time: {text!r}") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def format_timestamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


_TABLE_HEADER = re.compile(r"^\s*(\[\[?)\s*([A-Za-z0-9_.\-\" ]+?)\s*\]\]?\s*(?:#.*)?$")


@dataclass(frozen=True)
class TomlLocator:
    """Finds the line of a key in TOML text, for error messages (tomllib keeps no positions).

    ``line_of("jobs", 2, "gpus")`` is the line of ``gpus =`` in the third ``[[jobs]]`` table;
    ``line_of("cluster", None, "step")`` that of ``step =`` in ``[cluster]``.
    """

    text: str

    def _table_span(self, table: str | None, index: int | None) -> tuple[int, int] | None:
        lines = self.text.splitlines()
        if table is None:
            end = next((i for i, ln in enumerate(lines) if _TABLE_HEADER.match(ln)), len(lines))
            return (0, end)
        seen = -1
        start = None
        for i, ln in enumerate(lines):
            m = _TABLE_HEADER.match(ln)
            if not m:
                continue
            if start is not None:
                return (start, i)
            name = m.group(2).replace('"', "").strip()
            is_array = m.group(1) == "[["
            if name == table and (is_array == (index is not None)):
                seen += 1
                if index is None or seen == index:
                    start = i
        if start is not None:
            return (start, len(lines))
        return None

    def line_of(self, table: str | None, index: int | None = None, key: str | None = None) -> int | None:
        span = self._table_span(table, index)
        if span is None:
            return None
        start, end = span
        if key is None:
            return start + 1 if table is not None else None
        pattern = re.compile(rf"^\s*\"?{re.escape(key)}\"?\s*=")
        lines = self.text.splitlines()
        for i in range(start, end):
            if pattern.match(lines[i]):
                return i + 1
        return start + 1 if table is not None else None
