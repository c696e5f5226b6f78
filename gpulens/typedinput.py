"""Typed input files: one reader that turns TOML or YAML text into typed structs, with file/key/line errors.

Every file a user writes (gpulens.toml, scenarios, rules files, web-config) is read here. The text is parsed by
``tomllib`` or PyYAML, then converted and validated by msgspec against a ``msgspec.Struct`` type: unknown keys,
wrong types and values outside a ``Meta`` constraint are rejected in C, and a failure becomes one
:class:`~gpulens.config.ConfigError` that names the file, the dotted key and its line. msgspec was chosen over
pydantic v2 because it is a smaller dependency, converts ~5x faster on our rules files, and its error paths are
easy to map back to a line.

Struct types declare ``forbid_unknown_fields=True`` (see :class:`InputStruct`) so a typo is an error, not a default.
Semantic checks that need more than a type (a duration string, a regex) run in ``__post_init__`` and raise
``ValueError``, which is reported at the struct's own key.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import yaml

from gpulens.config import ConfigError, TomlLocator

T = TypeVar("T")

_PATH_PART = re.compile(r"\.([A-Za-z_][\w\-]*)|\[(\d+)\]|\.`([^`]*)`")
_AT = re.compile(r"\s+-\s+at\s+`\$([^`]*)`$")
_UNKNOWN_FIELD = re.compile(r"Object contains unknown field `([^`]+)`")


class InputStruct(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Base of every typed input table: unknown keys are errors, instances are immutable."""


def split_path(path: str) -> list[str | int]:
    """``.targets[0].url`` -> ``["targets", 0, "url"]`` (msgspec's error paths, without the leading ``$``)."""
    parts: list[str | int] = []
    for m in _PATH_PART.finditer(path):
        if m.group(2) is not None:
            parts.append(int(m.group(2)))
        else:
            parts.append(m.group(1) or m.group(3))
    return parts


def dotted(parts: Sequence[str | int]) -> str | None:
    """``["targets", 0, "url"]`` -> ``targets[0].url``: how errors name a key."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or None


def toml_line(text: str, parts: Sequence[str | int]) -> int | None:
    """The line of the key at ``parts`` in TOML text, found by :class:`TomlLocator` (tomllib keeps no positions)."""
    locator = TomlLocator(text)
    names = [p for p in parts if isinstance(p, str)]
    if not names:
        return None
    # [[table]] arrays: table, index, key; [table]: table, key; a bare key at the top: key.
    if len(parts) >= 2 and isinstance(parts[1], int):
        table = str(parts[0])
        key = parts[2] if len(parts) >= 3 and isinstance(parts[2], str) else None
        return locator.line_of(table, parts[1], key)
    if len(parts) == 1:
        return locator.line_of(None, None, names[0]) or locator.line_of(names[0])
    # a nested table: try the longest dotted table name that exists, then the key in it
    for cut in range(len(names) - 1, 0, -1):
        table = ".".join(names[:cut])
        line = locator.line_of(table, None, names[cut])
        if line is not None:
            return line
    return locator.line_of(names[0])


def yaml_line(text: str, parts: Sequence[str | int]) -> int | None:
    """The line of the node at ``parts`` in YAML text (PyYAML's composer keeps positions)."""
    try:
        node: Any = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    line = None
    for part in parts:
        if node is None:
            break
        if isinstance(part, int) and isinstance(node, yaml.SequenceNode) and part < len(node.value):
            node = node.value[part]
        elif isinstance(part, str) and isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if getattr(k, "value", None) == part), None)
            if match is None:
                break
            line = match[0].start_mark.line + 1
            node = match[1]
            continue
        else:
            break
        line = node.start_mark.line + 1
    return line


def _error(exc: Exception, text: str, source: str, kind: str) -> ConfigError:
    message = str(exc)
    path = ""
    m = _AT.search(message)
    if m:
        path = m.group(1)
        message = message[: m.start()]
    parts = split_path(path)
    unknown = _UNKNOWN_FIELD.match(message)
    if unknown:
        parts = [*parts, unknown.group(1)]
        message = "unknown key"
    else:
        message = message.replace("`", "")
        message = message[:1].lower() + message[1:]
    line = (toml_line if kind == "toml" else yaml_line)(text, parts)
    return ConfigError(message, file=source, key=dotted(parts), line=line)


def convert(data: Any, type_: type[T], *, text: str, source: str, kind: str = "toml") -> T:
    """Convert already-parsed ``data`` to ``type_``; errors are located in ``text`` (``kind``: toml or yaml)."""
    try:
        return msgspec.convert(data, type_, strict=True)
    except (msgspec.ValidationError, ValueError, TypeError) as exc:
        raise _error(exc, text, source, kind) from None


def parse_toml(text: str, source: str) -> dict[str, Any]:
    """TOML text -> a dict; a syntax error is a ConfigError with the line tomllib reports."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+)", str(exc))
        raise ConfigError(f"invalid TOML: {exc}", file=source, line=int(m.group(1)) if m else None) from None


def parse_yaml(text: str, source: str) -> Any:
    """YAML text -> plain data; a syntax error is a ConfigError with its line."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise ConfigError(f"invalid YAML: {str(exc).splitlines()[0]}", file=source, line=line) from None


def decode_toml(text: str, type_: type[T], source: str = "<toml>") -> T:
    """TOML text -> ``type_``, validated; every failure is one ConfigError with file, key and line."""
    return convert(parse_toml(text, source), type_, text=text, source=source, kind="toml")


def decode_yaml(text: str, type_: type[T], source: str = "<yaml>") -> T:
    """YAML text -> ``type_``, validated; every failure is one ConfigError with file, key and line."""
    data = parse_yaml(text, source)
    return convert({} if data is None else data, type_, text=text, source=source, kind="yaml")


def read_text(path: str | Path) -> str:
    """A config file's text; a missing or unreadable file is a one-line ConfigError."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", file=str(path)) from None
    except UnicodeDecodeError:
        raise ConfigError("not UTF-8 text", file=str(path)) from None
