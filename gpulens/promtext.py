"""The Prometheus text exposition format (0.0.4), read line by line into samples, as Prometheus reads it.

One decode path for every reader of a page: ``decode_page`` (UTF-8, a leading byte-order mark dropped). Lines are
split on ``\\n`` only (a trailing ``\\r`` is dropped, so CRLF works). Blank lines and comments are skipped: ``#``
lines, including a bare ``# HELP`` or a ``# TYPE`` with a word gpulens does not know, are comments, never bad
lines, except a ``HELP`` or ``TYPE`` followed by something that is not a metric name (``bad_comment``, as
Prometheus); a ``# HELP name text`` line records the family's help text. A sample is ``name [{labels}] value
[timestamp]``, blanks allowed between the name and ``{`` and around labels; label values take the escapes
``\\\\``, ``\\"`` and ``\\n``, and any other escape is kept as written (``\\f`` stays a backslash and an ``f``), as
Prometheus and client_python do; a repeated label name is bad; values are decimal numbers, ``NaN`` or ``[+-]Inf``;
the optional timestamp is an integer (ms). A series (name and labels) seen twice keeps the line with the newest
timestamp (a line without one is read at scrape time, so it is the newest; two equal ones keep the first); the
other is counted as ``duplicate_series``.

A page ends with a line feed. A last line without one may be a body cut short, so it is never used: it is counted
as ``truncated`` (``LineStats.truncated``) and the lines before it are kept.

Limits (``TextLimits``; each hit counted in ``LineStats.limits`` by reason, the rest of the page kept): a line over
``line_length`` characters is skipped before it is parsed, and a label value over ``label_value_length`` or a series
with more than ``labels_per_series`` labels rejects its line; samples after ``series_per_page`` distinct series are
dropped. Label values are scanned with one character-class pattern at a time, so a long line costs memory and time
in proportion to its length. A bad line is counted by reason and skipped, never fatal.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

_NAME_RE: Final = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME_RE: Final = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# One character class repeated: the regex engine keeps no backtracking state per character (linear memory). The
# pattern this replaces, ``(?:[^"\\]|\\.)*``, kept some 190 bytes per character of a label value.
_PLAIN_RE: Final = re.compile(r'[^"\\]*')
_BLANKS_RE: Final = re.compile(r"[ \t]*")
_SPLIT_RE: Final = re.compile(r"[ \t]+")
_VALUE_RE: Final = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?i:inf|infinity)|(?i:nan)")
_TIMESTAMP_RE: Final = re.compile(r"-?[0-9]{1,19}")
_UNESCAPES: Final = {"\\": "\\", '"': '"', "n": "\n"}

# Reasons counted in ``LineStats.limits``.
LINE_TOO_LONG: Final = "line_too_long"
LABEL_VALUE_TOO_LONG: Final = "label_value_too_long"
TOO_MANY_LABELS: Final = "too_many_labels"
SERIES_LIMIT: Final = "series_limit"
TRUNCATED: Final = "truncated"


@dataclass(frozen=True, slots=True)
class TextLimits:
    """What one page may hold (docs/operations.md, "Limits"). Prometheus leaves its own limits unset by default;
    these follow the defaults of the Prometheus-compatible stores (Mimir, Cortex: label values of 2,048 characters),
    widened where dcgm-exporter's pages need it (pod labels add to a series' labels)."""

    line_length: int = 65_536
    label_value_length: int = 2_048
    labels_per_series: int = 64
    series_per_page: int = 100_000


DEFAULT_LIMITS: Final = TextLimits()


class BadLineError(Exception):
    """A line that is not valid text format (or passes a limit); ``reason`` names the rule it breaks."""

    def __init__(self, reason: str, *, limit: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.limit = limit


class PageDecodeError(ValueError):
    """The page is not UTF-8; ``start`` is the offset of the first byte that is not."""

    def __init__(self, start: int) -> None:
        super().__init__(f"not UTF-8 (byte {start})")
        self.start = start


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample line: metric name, labels, value, and its timestamp in ms when the line has one."""

    name: str
    labels: dict[str, str]
    value: float
    timestamp_ms: int | None = None


def decode_page(body: bytes) -> str:
    """A page's text: UTF-8, a leading byte-order mark dropped (every reader of a page decodes it here)."""
    try:
        return body.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise PageDecodeError(exc.start) from None


def _label_value(line: str, pos: int, limits: TextLimits) -> tuple[str, int]:
    """The label value starting just after its opening quote, and the position after its closing quote."""
    parts: list[str] = []
    length = 0
    end = len(line)
    while True:
        plain = _PLAIN_RE.match(line, pos)
        if plain is None:  # pragma: no cover (the pattern matches the empty string)
            raise BadLineError("bad_labels")
        text = plain.group()
        parts.append(text)
        length += len(text)
        pos = plain.end()
        if pos >= end:
            raise BadLineError("bad_labels")
        if line[pos] == '"':
            if length > limits.label_value_length:
                raise BadLineError(LABEL_VALUE_TOO_LONG, limit=True)
            return "".join(parts), pos + 1
        if pos + 1 >= end:  # a backslash ends the line
            raise BadLineError("bad_labels")
        escaped = line[pos + 1]
        parts.append(_UNESCAPES.get(escaped, "\\" + escaped))  # an unknown escape is kept as written
        length += 1
        pos += 2


def _parse_labels(line: str, pos: int, limits: TextLimits) -> tuple[dict[str, str], int]:
    """Parse ``{...}`` starting just after the ``{``; returns the labels and the position after ``}``."""
    labels: dict[str, str] = {}
    while True:
        pos = _BLANKS_RE.match(line, pos).end()  # type: ignore[union-attr]
        if line.startswith("}", pos):
            return labels, pos + 1
        name_match = _LABEL_NAME_RE.match(line, pos)
        if name_match is None:
            raise BadLineError("bad_labels")
        name = name_match.group()
        pos = _BLANKS_RE.match(line, name_match.end()).end()  # type: ignore[union-attr]
        if not line.startswith("=", pos):
            raise BadLineError("bad_labels")
        pos = _BLANKS_RE.match(line, pos + 1).end()  # type: ignore[union-attr]
        if not line.startswith('"', pos):
            raise BadLineError("bad_labels")
        value, pos = _label_value(line, pos + 1, limits)
        if name in labels:
            raise BadLineError("duplicate_label")
        labels[name] = value
        if len(labels) > limits.labels_per_series:
            raise BadLineError(TOO_MANY_LABELS, limit=True)
        pos = _BLANKS_RE.match(line, pos).end()  # type: ignore[union-attr]
        if line.startswith(",", pos):
            pos += 1
        elif not line.startswith("}", pos):
            raise BadLineError("bad_labels")


def parse_line(raw: str, limits: TextLimits = DEFAULT_LIMITS) -> Sample | None:
    """One line -> a sample, or ``None`` for a blank or comment line. Raises ``BadLineError``."""
    if len(raw) > limits.line_length:
        raise BadLineError(LINE_TOO_LONG, limit=True)
    line = raw.removesuffix("\r").strip(" \t")
    if not line:
        return None
    if line.startswith("#"):
        words = _SPLIT_RE.split(line[1:].strip(" \t"), maxsplit=2)
        if words[0] in ("HELP", "TYPE") and len(words) > 1 and not _NAME_RE.fullmatch(words[1]):
            raise BadLineError("bad_comment")  # as Prometheus: HELP and TYPE name a metric when they name anything
        return None
    match = _NAME_RE.match(line)
    if match is None:
        raise BadLineError("bad_name")
    name = match.group()
    pos = _BLANKS_RE.match(line, match.end()).end()  # type: ignore[union-attr]
    labels: dict[str, str] = {}
    if line.startswith("{", pos):
        labels, pos = _parse_labels(line, pos + 1, limits)
    elif pos == match.end() and pos < len(line):
        raise BadLineError("bad_name")
    tokens = _SPLIT_RE.split(line[pos:].strip(" \t"))
    if not _VALUE_RE.fullmatch(tokens[0]):
        raise BadLineError("bad_value")
    if len(tokens) > 2:
        raise BadLineError("trailing_garbage")
    timestamp = None
    if len(tokens) == 2:
        if not _TIMESTAMP_RE.fullmatch(tokens[1]):
            raise BadLineError("bad_timestamp")
        timestamp = int(tokens[1])
    return Sample(name, labels, float(tokens[0]), timestamp)


def help_of(line: str) -> tuple[str, str] | None:
    """``# HELP name text`` -> (name, text); ``None`` for any other line (a bare ``# HELP`` included)."""
    parts = _SPLIT_RE.split(line.removesuffix("\r").strip(" \t"), maxsplit=3)
    if len(parts) < 3 or parts[0] != "#" or parts[1] != "HELP" or not _NAME_RE.fullmatch(parts[2]):
        return None
    return parts[2], parts[3] if len(parts) > 3 else ""


@dataclass(slots=True)
class LineStats:
    """What reading a page found: well-formed samples, bad lines and limit hits by reason, the first bad line."""

    samples: int = 0
    bad_reasons: dict[str, int] = field(default_factory=dict)
    limits: dict[str, int] = field(default_factory=dict)  # limit hits by reason, and ``truncated``
    first_bad_line: int | None = None
    truncated: bool = False  # the last line has no line feed: it was not used
    help: dict[str, str] = field(default_factory=dict)  # metric name -> its HELP text

    def bad(self, reason: str, lineno: int) -> None:
        self.bad_reasons[reason] = self.bad_reasons.get(reason, 0) + 1
        if self.first_bad_line is None:
            self.first_bad_line = lineno

    def hit(self, reason: str, n: int = 1) -> None:
        self.limits[reason] = self.limits.get(reason, 0) + n


def _lines(text: str, limits: TextLimits, stats: LineStats) -> Iterator[tuple[int, str]]:
    """The page's complete lines, numbered; a line over the length limit is counted and never copied."""
    pos, end, lineno = 0, len(text), 0
    while pos < end:
        lineno += 1
        stop = text.find("\n", pos)
        if stop < 0:  # no line feed after it: maybe cut in transit, never used
            if text[pos:].strip(" \t\r"):
                stats.truncated = True
                stats.hit(TRUNCATED)
            return
        if stop - pos > limits.line_length:
            stats.hit(LINE_TOO_LONG)
        else:
            yield lineno, text[pos:stop]
        pos = stop + 1


def read_samples(text: str, stats: LineStats, limits: TextLimits = DEFAULT_LIMITS) -> Iterator[Sample]:
    """The page's samples, each series once, in the order series first appear; bad lines, repeated series and
    limit hits are counted in ``stats`` and skipped. The whole page is read before the first sample is given."""
    kept: dict[tuple[str, tuple[tuple[str, str], ...]], Sample] = {}
    for lineno, raw in _lines(text, limits, stats):
        try:
            sample = parse_line(raw, limits)
        except BadLineError as bad:
            if bad.limit:
                stats.hit(bad.reason)
            else:
                stats.bad(bad.reason, lineno)
            continue
        if sample is None:
            if raw.startswith("# HELP"):
                found = help_of(raw)
                if found is not None:
                    stats.help.setdefault(*found)
            continue
        key = (sample.name, tuple(sorted(sample.labels.items())))
        held = kept.get(key)
        if held is None:
            if len(kept) >= limits.series_per_page:
                stats.hit(SERIES_LIMIT)
                continue
            kept[key] = sample
            continue
        stats.bad("duplicate_series", lineno)
        if _newer(sample.timestamp_ms, held.timestamp_ms):
            kept[key] = sample
    stats.samples += len(kept)
    yield from kept.values()


def _newer(new: int | None, held: int | None) -> bool:
    """Whether a repeated series' line is newer than the one held (no timestamp: read at scrape time, the newest)."""
    if held is None:
        return False
    return new is None or new > held
