"""The Prometheus text exposition format (0.0.4), read line by line into samples.

Lines are split on ``\\n`` only (a trailing ``\\r`` is dropped, so CRLF works). Comments (``# HELP``, ``# TYPE``,
anything else after ``#``) and blank lines are skipped; a malformed ``HELP``/``TYPE`` line is bad. A sample is
``name[{labels}] value [timestamp]``; label values accept the escapes ``\\\\``, ``\\"`` and ``\\n`` and nothing
else; a repeated label name or a series (name and labels) seen twice is bad; values are decimal numbers, ``NaN`` or
``[+-]Inf``; the optional timestamp is an integer and is ignored. A bad line is counted by reason and skipped, never
fatal. A page ends with a newline: a last line without one that is not a complete sample was cut in transit, and
``LineStats.truncated`` says so (the reader rejects the whole page).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

_NAME_RE: Final = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_RE: Final = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"')
_SPLIT_RE: Final = re.compile(r"[ \t]+")
_ESCAPE_RE: Final = re.compile(r"\\(.)")
_VALUE_RE: Final = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?i:inf|infinity)|(?i:nan)")
_TIMESTAMP_RE: Final = re.compile(r"-?[0-9]+")
_METRIC_TYPES: Final = frozenset({"counter", "gauge", "histogram", "summary", "untyped"})
_UNESCAPES: Final = {"\\": "\\", '"': '"', "n": "\n"}


class BadLineError(Exception):
    """A line that is not valid text format; ``reason`` names the rule it breaks."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample line: metric name, labels, value (the timestamp is dropped)."""

    name: str
    labels: dict[str, str]
    value: float


def _unescape_one(match: re.Match[str]) -> str:
    try:
        return _UNESCAPES[match.group(1)]
    except KeyError:
        raise BadLineError("bad_escape") from None


def _skip_blanks(line: str, pos: int) -> int:
    while pos < len(line) and line[pos] in " \t":
        pos += 1
    return pos


def _parse_labels(line: str, pos: int) -> tuple[dict[str, str], int]:
    """Parse ``{...}`` starting just after the ``{``; returns the labels and the position after ``}``."""
    labels: dict[str, str] = {}
    while True:
        pos = _skip_blanks(line, pos)
        if line.startswith("}", pos):
            return labels, pos + 1
        match = _LABEL_RE.match(line, pos)
        if match is None:
            raise BadLineError("bad_labels")
        name, raw = match.group(1), match.group(2)
        if name in labels:
            raise BadLineError("duplicate_label")
        labels[name] = _ESCAPE_RE.sub(_unescape_one, raw) if "\\" in raw else raw
        pos = _skip_blanks(line, match.end())
        if line.startswith(",", pos):
            pos += 1
        elif not line.startswith("}", pos):
            raise BadLineError("bad_labels")


def _parse_comment(line: str) -> None:
    parts = _SPLIT_RE.split(line[1:].strip(" \t"), maxsplit=2)
    if parts[0] not in ("HELP", "TYPE"):
        return
    if len(parts) < 2 or not _NAME_RE.fullmatch(parts[1]):
        raise BadLineError("bad_comment")
    if parts[0] == "TYPE" and (len(parts) != 3 or parts[2] not in _METRIC_TYPES):
        raise BadLineError("bad_comment")


def parse_line(raw: str) -> Sample | None:
    """One line -> a sample, or ``None`` for a blank or comment line. Raises ``BadLineError``."""
    line = raw.removesuffix("\r").strip(" \t")
    if not line:
        return None
    if line.startswith("#"):
        _parse_comment(line)
        return None
    match = _NAME_RE.match(line)
    if match is None:
        raise BadLineError("bad_name")
    name, pos = match.group(), match.end()
    labels: dict[str, str] = {}
    if line.startswith("{", pos):
        labels, pos = _parse_labels(line, pos + 1)
    elif pos < len(line) and line[pos] not in " \t":
        raise BadLineError("bad_name")
    tokens = _SPLIT_RE.split(line[pos:].strip(" \t"))
    if not _VALUE_RE.fullmatch(tokens[0]):
        raise BadLineError("bad_value")
    if len(tokens) > 2:
        raise BadLineError("trailing_garbage")
    if len(tokens) == 2 and not _TIMESTAMP_RE.fullmatch(tokens[1]):
        raise BadLineError("bad_timestamp")
    return Sample(name, labels, float(tokens[0]))


@dataclass(slots=True)
class LineStats:
    """What reading a page's lines found: well-formed samples, bad lines by reason, the first bad line."""

    samples: int = 0
    bad_reasons: dict[str, int] = field(default_factory=dict)
    first_bad_line: int | None = None
    truncated: bool = False  # the last line has no newline and does not parse: the body was cut
    help: dict[str, str] = field(default_factory=dict)  # metric name -> its HELP text
    series: set[tuple[str, tuple[tuple[str, str], ...]]] = field(default_factory=set)

    def bad(self, reason: str, lineno: int) -> None:
        self.bad_reasons[reason] = self.bad_reasons.get(reason, 0) + 1
        if self.first_bad_line is None:
            self.first_bad_line = lineno


def read_samples(text: str, stats: LineStats) -> Iterator[Sample]:
    """The page's samples in order; bad lines and repeated series are counted in ``stats`` and skipped."""
    lines = text.split("\n")
    for lineno, raw in enumerate(lines, start=1):
        try:
            sample = parse_line(raw)
        except BadLineError as bad:
            if lineno == len(lines):  # no newline after it: cut mid-line
                stats.truncated = True
                stats.bad("truncated", lineno)
            else:
                stats.bad(bad.reason, lineno)
            continue
        if sample is None:
            if raw.startswith("# HELP "):
                parts = _SPLIT_RE.split(raw.removesuffix("\r").strip(" \t"), maxsplit=3)
                stats.help.setdefault(parts[2], parts[3] if len(parts) > 3 else "")
            continue
        key = (sample.name, tuple(sorted(sample.labels.items())))
        if key in stats.series:
            stats.bad("duplicate_series", lineno)
            continue
        stats.series.add(key)
        stats.samples += 1
        yield sample
