"""Typed input files: one reader that turns TOML or YAML text into typed structs, with file/key/line errors.

Every file a user writes (gpulens.toml, scenarios, rules files, web-config) is read here. The text is parsed by
``tomllib`` or PyYAML, then converted and validated by msgspec against a ``msgspec.Struct`` type: unknown keys,
wrong types and values outside a ``Meta`` constraint are rejected in C, and a failure becomes one
:class:`~gpulens.config.ConfigError` that names the file, the dotted key and its line. msgspec was chosen over
pydantic v2 because it is a smaller dependency, converts ~5x faster on our rules files, and its error paths are
easy to map back to a line.

Struct types declare ``forbid_unknown_fields=True`` (see :class:`InputStruct`) so a typo is an error, not a default.
Values that need parsing (:class:`Duration`) are types with a ``from_input`` classmethod, so their errors name their
own key. Semantic checks that need more than a type (a regex, two keys that exclude each other) run in
``__post_init__`` and raise :class:`FieldError` naming the key (or a plain ``ValueError``, reported at the struct's
own key); checks across tables run after conversion and raise :func:`input_error` with the key's path.
"""

from __future__ import annotations

import inspect
import re
import tomllib
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

import msgspec
import yaml

from gpulens.config import ConfigError, TomlLocator, parse_duration

T = TypeVar("T")
Part = str | int

_PATH_PART = re.compile(r"\.([A-Za-z_][\w\-]*)|\[(\d+)\]|\.`([^`]*)`")
_AT = re.compile(r"\s+-\s+at\s+(?:`key` in\s+)?`\$([^`]*)`$")
_UNKNOWN_FIELD = re.compile(r"Object contains unknown field `([^`]+)`")
_MISSING_FIELD = re.compile(r"Object missing required field `([^`]+)`")
_BAD_ENUM = re.compile(r"Invalid enum value (.*)")


class InputStruct(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Base of every typed input table: unknown keys are errors, instances are immutable.

    Subclasses repeat ``frozen=True`` (msgspec inherits it, but mypy's dataclass view does not), and those that add
    required keys to a base with defaults repeat ``kw_only=True``.
    """


class FieldError(ValueError):
    """Raised by an input struct's ``__post_init__``: ``message`` about its key ``key`` (a dotted key inside the
    struct). ``line_key``, when given, is the key whose line the error reports instead."""

    def __init__(self, key: str, message: str, *, line_key: str | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.line_key = line_key


class Duration(float):
    """Seconds, written ``"90s"``, ``"5m"``, ``"1h30m"`` or as a number of seconds (see ``parse_duration``)."""

    @classmethod
    def from_input(cls, value: Any) -> Duration:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ValueError(f'expected a duration such as "30s", got {value!r:.40}')
        return cls(parse_duration(value))


def _dec_hook(type_: type, value: Any) -> Any:
    """Custom input types (those with a ``from_input`` classmethod) are built by it; its ValueError names the key."""
    build = getattr(type_, "from_input", None)
    if build is None:
        raise NotImplementedError(type_)
    return build(value)


def split_path(path: str) -> list[Part]:
    """``.targets[0].url`` -> ``["targets", 0, "url"]`` (msgspec's error paths, without the leading ``$``)."""
    parts: list[Part] = []
    for m in _PATH_PART.finditer(path):
        if m.group(2) is not None:
            parts.append(int(m.group(2)))
        else:
            parts.append(m.group(1) or m.group(3))
    return parts


def dotted(parts: Sequence[Part]) -> str | None:
    """``["targets", 0, "url"]`` -> ``targets[0].url``: how errors name a key."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or None


def toml_line(text: str, parts: Sequence[Part]) -> int | None:
    """The line of the key at ``parts`` in TOML text, found by :class:`TomlLocator` (tomllib keeps no positions)."""
    locator = TomlLocator(text)
    # [[a.b]] arrays: the names before an index are the table, the name after it the key (the last index that
    # names a [[table]] wins; other indexes are items of inline arrays, on their key's line).
    for i in reversed([i for i, p in enumerate(parts) if isinstance(p, int) and i > 0]):
        table = ".".join(p for p in parts[:i] if isinstance(p, str))
        after = parts[i + 1] if len(parts) > i + 1 else None
        line = locator.line_of(table, int(parts[i]), after if isinstance(after, str) else None)
        if line is not None:
            return line
    names = [p for p in parts if isinstance(p, str)]
    if not names:
        return None
    if len(names) == 1:
        return locator.line_of(None, None, names[0]) or locator.line_of(names[0]) or locator.line_of(names[0], 0)
    # a nested table: the longest dotted table name that holds the key, then the table itself
    for cut in range(len(names) - 1, 0, -1):
        line = locator.line_of(".".join(names[:cut]), None, names[cut])
        if line is not None:
            return line
    return locator.line_of(None, None, names[0])  # an inline table: the line of its key


def yaml_line(text: str, parts: Sequence[Part]) -> int | None:
    """The line of the node at ``parts`` in YAML text (PyYAML's composer keeps positions)."""
    try:
        node: Any = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    line = node.start_mark.line + 1 if node is not None and not parts else None  # the document itself
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


def _unwrap(type_: Any) -> Any:
    """``Annotated[X, ...]`` -> X; ``X | None`` -> X."""
    while typing.get_origin(type_) is typing.Annotated:
        type_ = typing.get_args(type_)[0]
    if typing.get_origin(type_) in (Union, types.UnionType):
        members = [a for a in typing.get_args(type_) if a is not type(None)]
        if len(members) == 1:
            return _unwrap(members[0])
    return type_


def input_fields(struct: type[msgspec.Struct]) -> dict[str, msgspec.structs.FieldInfo]:
    """A struct's fields by the names a file uses for them (``for``, not ``for_``): its own first, then its bases'."""
    own = inspect.get_annotations(struct)
    fields = sorted(msgspec.structs.fields(struct), key=lambda f: f.name not in own)
    return {f.encode_name: f for f in fields}


def _type_at(type_: Any, parts: Sequence[Part]) -> Any:
    """The type expected at ``parts`` inside ``type_`` (None when the path leaves the typed part)."""
    for part in parts:
        type_ = _unwrap(type_)
        if isinstance(type_, type) and issubclass(type_, msgspec.Struct) and isinstance(part, str):
            field = input_fields(type_).get(part)
            if field is None:
                return None
            type_ = field.type
        elif isinstance(part, int) and typing.get_origin(type_) in (list, tuple):
            type_ = typing.get_args(type_)[0]
        else:
            return None
    return _unwrap(type_)


def _message(exc: Exception, type_: Any, at: Sequence[Part]) -> tuple[str, list[Part], list[Part] | None]:
    """msgspec's error -> (our message, the key's path, the path whose line to report, if not the key's)."""
    cause = exc.__cause__  # msgspec chains the ValueError raised by __post_init__ or from_input
    message = str(exc)
    path = ""
    m = _AT.search(message)
    if m:
        path = m.group(1)
        message = message[: m.start()]
    parts = split_path(path)
    if isinstance(cause, FieldError):
        line_parts = [*at, *parts, *cause.line_key.split(".")] if cause.line_key else None
        return str(cause), [*at, *parts, *cause.key.split(".")], line_parts
    if isinstance(cause, ValueError | TypeError) and not isinstance(cause, msgspec.ValidationError):
        return str(cause), [*at, *parts], None
    if m := _UNKNOWN_FIELD.match(message):
        struct = _type_at(type_, parts)
        expected = ""
        if isinstance(struct, type) and issubclass(struct, msgspec.Struct):
            expected = f" (expected one of: {', '.join(input_fields(struct))})"
        return f"unknown key{expected}", [*at, *parts, m.group(1)], None
    if m := _MISSING_FIELD.match(message):
        return "missing required key", [*at, *parts, m.group(1)], None
    if m := _BAD_ENUM.match(message):
        choices = _type_at(type_, parts)
        if typing.get_origin(choices) is Literal:
            shown = ", ".join(str(c) for c in typing.get_args(choices))
            return f"expected one of: {shown}, got {m.group(1)[:40]}", [*at, *parts], None
    message = message.replace("`", "")
    return message[:1].lower() + message[1:], [*at, *parts], None


def input_error(
    message: str,
    parts: Sequence[Part],
    *,
    text: str,
    source: str | None,
    kind: str = "toml",
    line_parts: Sequence[Part] | None = None,
) -> ConfigError:
    """A ConfigError about the key at ``parts`` (its line found in ``text``), for checks made after conversion."""
    locate = toml_line if kind == "toml" else yaml_line
    line = locate(text, parts if line_parts is None else line_parts) if text else None
    return ConfigError(message, file=source, key=dotted(parts), line=line)


def convert(
    data: Any, type_: type[T], *, text: str, source: str | None, kind: str = "toml", at: Sequence[Part] = ()
) -> T:
    """Convert already-parsed ``data`` to ``type_``; errors are located in ``text`` (``kind``: toml or yaml).

    ``at`` is where ``data`` sits in the file (``("alerts",)`` for the ``[alerts]`` table of a whole config).
    """
    try:
        return msgspec.convert(data, type_, strict=True, dec_hook=_dec_hook)
    except (msgspec.ValidationError, ValueError, TypeError) as exc:
        message, parts, line_parts = _message(exc, type_, at)
        raise input_error(message, parts, text=text, source=source, kind=kind, line_parts=line_parts) from None


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
