"""The site's own rows of the causal and inhibition tables: ``[[alerts.causes]]`` and ``[[alerts.inhibitions]]`` in the
config, checked and turned into ``Explains`` and ``Inhibition`` rows.

```toml
[[alerts.causes]]
cause = "GpuHot"                    # a rule (builtin or [[alerts.rules]]), or a list of them
match = ["node=~gpu-a.*"]           # optional: label matchers the cause alert meets
effects = ["JobStraggler"]          # the rules it explains; ["*"]: every alert the join reaches
join = "named_gpu"                  # how they meet: one of causes.JOINS
why = "a hot GPU slows its rank"    # optional: shown nowhere but the config, for the reader
```

```toml
[[alerts.inhibitions]]
source = "GpuLost"                  # a firing alert of this rule (builtin or [[alerts.rules]]) ...
equal = ["uuid"]                    # ... mutes the alerts sharing these labels' values with it
targets = ["GpuIdleAllocated"]      # optional: only alerts of these rules (else every other alert)
cause = true                        # optional: show the muted alerts, marked as caused by the source
```

The rows are appended to the builtin tables (``causes.table``); the joins are the builtin table's, implemented by
``incidentparts.explains``. Every problem is a ``ConfigError`` naming the file, the dotted key and the line: an
unknown key, a rule that is neither builtin nor the config's, an unknown join, a matcher that does not parse.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from gpulens.alerts.causes import JOINS, Explains
from gpulens.alerts.matchers import Matcher, MatcherError, parse_matcher
from gpulens.alerts.state import Inhibition
from gpulens.typedinput import FieldError, InputStruct, Part, input_error

ANY_EFFECT = "*"


class CauseFile(InputStruct, frozen=True, kw_only=True):
    """One ``[[alerts.causes]]`` table."""

    cause: str | tuple[str, ...]
    effects: str | tuple[str, ...]
    join: str
    match: str | tuple[str, ...] = ()
    why: str = ""

    def __post_init__(self) -> None:
        if not _listed(self.cause):
            raise FieldError("cause", "expected a rule name or a list of them")
        if not _listed(self.effects):
            raise FieldError("effects", 'expected a list of rule names, or ["*"] (every alert)')
        if self.join not in JOINS:
            raise FieldError("join", f"unknown join {self.join!r}: one of {', '.join(JOINS)}")
        self.matchers()

    def matchers(self) -> tuple[Matcher, ...]:
        try:
            return tuple(parse_matcher(m) for m in _listed(self.match))
        except MatcherError as exc:
            raise FieldError("match", str(exc)) from None


class InhibitionFile(InputStruct, frozen=True, kw_only=True):
    """One ``[[alerts.inhibitions]]`` table."""

    source: str
    equal: tuple[str, ...]
    targets: tuple[str, ...] = ()
    cause: bool = False

    def __post_init__(self) -> None:
        if not self.equal or not all(self.equal):
            raise FieldError("equal", 'expected the labels a muted alert shares with its source, e.g. ["node"]')


def _listed(value: str | tuple[str, ...]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else value


def build_causes(
    files: Sequence[CauseFile], *, rules: Collection[str], at: Sequence[Part], text: str, source: str | None
) -> tuple[Explains, ...]:
    """The ``Explains`` rows of the config; ``rules``: every rule name the config knows (builtin and its own)."""
    rows = []
    for i, f in enumerate(files):
        for key, names in (("cause", _listed(f.cause)), ("effects", _listed(f.effects))):
            allowed = (ANY_EFFECT,) if key == "effects" else ()
            unknown = [n for n in names if n not in rules and n not in allowed]
            if unknown:
                raise input_error(f"no alert rule named {unknown[0]!r}", [*at, i, key], text=text, source=source)
        why = f.why or f"config: {', '.join(_listed(f.cause))} explains {', '.join(_listed(f.effects))}"
        rows.append(Explains(_listed(f.cause), _listed(f.effects), f.join, why, f.matchers()))
    return tuple(rows)


def build_inhibitions(
    files: Sequence[InhibitionFile], *, rules: Collection[str], at: Sequence[Part], text: str, source: str | None
) -> tuple[Inhibition, ...]:
    """The ``Inhibition`` rows of the config, to follow the builtin ones (``state.DEFAULT_INHIBITIONS``)."""
    rows = []
    for i, f in enumerate(files):
        for key, names in (("source", (f.source,)), ("targets", f.targets)):
            unknown = [n for n in names if n not in rules]
            if unknown:
                raise input_error(f"no alert rule named {unknown[0]!r}", [*at, i, key], text=text, source=source)
        rows.append(Inhibition(f.source, f.equal, f.targets, f.cause))
    return tuple(rows)
