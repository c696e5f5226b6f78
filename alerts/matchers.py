"""Label matchers, as Alertmanager writes them: ``node=node-01``, ``node!=node-02``, ``node=~node-0[1-3]``,
``job_id!~dev-.*``.

Regular expressions are anchored (they must match the whole value). A label an alert lacks has the value ``""``.
Silences and routes use them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

OPERATORS: Final = ("=~", "!~", "!=", "=")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class MatcherError(ValueError):
    """A matcher that cannot be parsed or compiled."""


@dataclass(frozen=True)
class Matcher:
    name: str
    op: str
    value: str
    _pattern: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise MatcherError(f"{self.name!r} is not a label name")
        if self.op not in OPERATORS:
            raise MatcherError(f"unknown operator {self.op!r} (use =, !=, =~ or !~)")
        if self.op in ("=~", "!~"):
            try:
                object.__setattr__(self, "_pattern", re.compile(self.value))
            except re.error as exc:
                raise MatcherError(f"{self.name}{self.op}{self.value}: bad regular expression: {exc}") from None

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.name, "")
        if self._pattern is not None:
            found = self._pattern.fullmatch(value) is not None
            return found if self.op == "=~" else not found
        return (value == self.value) if self.op == "=" else (value != self.value)

    def __str__(self) -> str:
        return f"{self.name}{self.op}{self.value}"

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "op": self.op, "value": self.value}


def parse_matcher(text: str) -> Matcher:
    """``name=value``, ``name!=value``, ``name=~regex`` or ``name!~regex``. Raises ``MatcherError``."""
    for i, ch in enumerate(text):
        if ch in "=!":
            name = text[:i].strip()
            rest = text[i:]
            op = next((o for o in OPERATORS if rest.startswith(o)), None)
            if op is None:
                break
            value = rest[len(op) :].strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
                value = value[1:-1]
            return Matcher(name, op, value)
    raise MatcherError(f"not a matcher: {text!r} (use name=value, name!=value, name=~regex or name!~regex)")


def matches_all(matchers: Iterable[Matcher], labels: Mapping[str, str]) -> bool:
    return all(m.matches(labels) for m in matchers)


def matchers_to_json(matchers: Sequence[Matcher]) -> list[dict[str, str]]:
    return [m.to_json() for m in matchers]


def matchers_from_json(data: Any) -> tuple[Matcher, ...]:
    """The inverse of ``matchers_to_json``; also accepts ``{"name": "value"}`` (equality) and ``["name=value"]``."""
    if isinstance(data, Mapping):
        return tuple(Matcher(str(k), "=", str(v)) for k, v in data.items())
    if not isinstance(data, list):
        raise MatcherError("expected a list of matchers")
    out = []
    for item in data:
        if isinstance(item, str):
            out.append(parse_matcher(item))
        elif isinstance(item, Mapping) and {"name", "op", "value"} <= set(item):
            out.append(Matcher(str(item["name"]), str(item["op"]), str(item["value"])))
        else:
            raise MatcherError(f"not a matcher: {item!r:.60}")
    return tuple(out)
