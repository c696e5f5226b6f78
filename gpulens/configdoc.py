"""The configuration reference (``docs/configuration.md``), generated from the typed structs of ``gpulens.toml``.

Every table of :class:`gpulens.settings.SettingsFile` becomes a section: its docstring is the section's help, and
each key's type, default, choices, environment variable and help come from the struct field and its
``Annotated[..., doc(...)]`` metadata. Regenerate with ``python -m gpulens.configdoc > docs/configuration.md``; a
test keeps the file current.
"""

from __future__ import annotations

import inspect
import sys
import typing
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from gpulens.config import format_duration
from gpulens.settings import SettingsFile
from gpulens.typedinput import Duration, input_fields

_EXAMPLE = """\
## Example

```toml
[database]
url_file = "/run/secrets/gpulens-db-url"   # postgresql+psycopg://gpulens:...@db/gpulens

[collector]
interval = "10s"
shard = "0/2"                               # this collector scrapes half of the targets

[[targets]]
url = "http://gpu-node-07:9410"

[[targets]]
url = "http://gpu-node-08:9400/metrics"     # a dcgm-exporter
kind = "dcgm"

[[file_sd]]
files = ["/etc/gpulens/targets/*.json"]
username = "prometheus"
password_file = "/etc/gpulens/scrape-password"
```
"""


@dataclass(frozen=True)
class KeyDoc:
    """One key of the reference."""

    name: str
    kind: str  # str | int | bool | duration | list[str] | shard | listen
    default: str  # as written in the file, or "-"
    help: str
    choices: tuple[str, ...] = ()
    env: str | None = None


def _split(annotation: Any) -> tuple[Any, msgspec.Meta | None]:
    """``Annotated[X | None, Meta]`` -> (X, Meta)."""
    meta = None
    if typing.get_origin(annotation) is typing.Annotated:
        annotation, *extras = typing.get_args(annotation)
        meta = next((m for m in extras if isinstance(m, msgspec.Meta)), None)
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is not Literal and type(None) in args:
        (annotation,) = [a for a in args if a is not type(None)]
    return annotation, meta


def _kind(python_type: Any) -> str:
    if python_type is Duration:
        return "duration"
    if typing.get_origin(python_type) is Literal:
        return "str"
    if typing.get_origin(python_type) is tuple:
        return f"list[{typing.get_args(python_type)[0].__name__}]"
    return str(python_type.__name__)


def _default(field: msgspec.structs.FieldInfo, kind: str) -> str:
    value = field.default
    if value is msgspec.NODEFAULT or value is None:
        return "-"
    if kind == "duration":
        return f'`"{format_duration(value)}"`'
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{value}`"


def keys_of(struct: type[msgspec.Struct]) -> list[KeyDoc]:
    """The documented keys of a table: its own fields first, then those it shares with other tables (its bases)."""
    out = []
    for field in input_fields(struct).values():
        python_type, meta = _split(field.type)
        extra = dict(meta.extra or {}) if meta is not None else {}
        kind = extra.get("kind") or _kind(python_type)
        choices = tuple(typing.get_args(python_type)) if typing.get_origin(python_type) is Literal else ()
        help_text = (meta.description if meta is not None else None) or ""
        out.append(KeyDoc(field.encode_name, kind, _default(field, kind), help_text, choices, extra.get("env")))
    return out


def _help(struct: type) -> str:
    return " ".join(inspect.cleandoc(struct.__doc__ or "").split("\n"))


def configuration_reference() -> str:
    lines = [
        "# Configuration reference (`gpulens.toml`)",
        "",
        "Generated from the typed schema in `gpulens/settings.py` by `gpulens/configdoc.py`",
        "(`python -m gpulens.configdoc > docs/configuration.md`); a test keeps it current. `gpulens check-config FILE`",
        'validates a file: every error names the file, the key and the line. Durations are strings like `"30s"`,',
        '`"5m"`, `"7d"`.',
        "",
        "Secrets stay out of the file: `GPULENS_DB_URL` overrides `database.url` (or use `database.url_file`), and a",
        "target's password comes from `password_file` or `password_env`. Passwords never appear in logs or errors.",
        "",
    ]
    delegated = []
    for section in msgspec.structs.fields(SettingsFile):
        table, meta = _split(section.type)
        if meta is not None and (meta.extra or {}).get("kind") == "delegated":
            delegated += [f"## `[{section.encode_name}]`", "", f"The {meta.description}.", ""]
            continue
        array = typing.get_origin(table) is tuple
        struct = typing.get_args(table)[0] if array else table
        header = f"[[{section.encode_name}]]" if array else f"[{section.encode_name}]"
        lines += [f"## `{header}`", "", _help(struct), "", "| key | type | default | meaning |", "|---|---|---|---|"]
        for key in keys_of(struct):
            meaning = key.help
            if key.choices:
                meaning += f" One of {', '.join(f'`{c}`' for c in key.choices)}."
            if key.env:
                meaning += f" Environment: `{key.env}`."
            lines.append(f"| `{key.name}` | {key.kind} | {key.default} | {meaning} |")
        lines.append("")
    return "\n".join([*lines, *delegated, _EXAMPLE])


if __name__ == "__main__":
    sys.stdout.write(configuration_reference())
