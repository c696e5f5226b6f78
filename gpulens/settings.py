"""The gpulens TOML configuration file (``gpulens.toml``): its schema, validation and environment overrides.

The schema below is the single source of truth: the loader validates against it (unknown keys, wrong types and bad
values are errors naming the file, the key and the line) and ``docs/configuration.md`` is generated from it
(``python -m gpulens.settings > docs/configuration.md``), so the reference cannot drift from the code.

Secrets never live in the file itself unless the operator insists: the database URL can come from
``GPULENS_DB_URL`` or ``url_file``, and a target's password from ``password_file`` or ``password_env``.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from gpulens.config import ConfigError, TomlLocator, parse_duration

# --- the schema -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Key:
    name: str
    kind: str  # str | int | bool | duration | list[str] | shard | listen
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    env: str | None = None
    minimum: float | None = None


@dataclass(frozen=True)
class Section:
    name: str
    help: str
    keys: tuple[Key, ...]
    array: bool = False  # [[name]] tables


_TLS_KEYS: Final = (
    Key("username", "str", None, "Basic-auth user name."),
    Key("password_file", "str", None, "File holding the basic-auth password (first line)."),
    Key("password_env", "str", None, "Environment variable holding the basic-auth password."),
    Key("ca_file", "str", None, "CA bundle to verify the target's TLS certificate."),
    Key("insecure_skip_verify", "bool", False, "Do not verify the target's TLS certificate (testing only)."),
)

SCHEMA: Final[tuple[Section, ...]] = (
    Section(
        "database",
        "Where the history is stored.",
        (
            Key(
                "url",
                "str",
                "sqlite:///gpulens.db",
                "SQLAlchemy URL: `sqlite:///path.db` (embedded) or `postgresql+psycopg://user@host/db`.",
                env="GPULENS_DB_URL",
            ),
            Key("url_file", "str", None, "File holding the URL (keeps the password out of the config)."),
        ),
    ),
    Section(
        "collector",
        "The scrape loop.",
        (
            Key("interval", "duration", 10.0, "Time between scrape rounds.", minimum=0.1),
            Key("timeout", "duration", 5.0, "Per-target scrape timeout (capped at the interval).", minimum=0.01),
            Key("max_response_bytes", "int", 16 * 1024 * 1024, "Largest response accepted per target.", minimum=1024),
            Key("concurrency", "int", 64, "Targets scraped at the same time.", minimum=1),
            Key("listen", "listen", "127.0.0.1:9411", "Where the collector serves its own /metrics."),
            Key("shard", "shard", "0/1", "`I/N`: scrape only the targets whose name hashes to I of N."),
            Key("spool_dir", "str", "gpulens-spool", "Where rounds wait while the database is unreachable."),
            Key("spool_max_bytes", "int", 1024**3, "Spool size limit; the oldest rounds go first.", minimum=1024),
            Key("future_tolerance", "duration", 300.0, "Readings stamped further in the future are rejected."),
        ),
    ),
    Section(
        "retention",
        "How long each resolution is kept.",
        (
            Key("raw", "duration", 7 * 86400.0, "Raw readings (one row per GPU per scrape)."),
            Key("minute", "duration", 90 * 86400.0, "1-minute min/avg/max rollups."),
            Key("hour", "duration", 730 * 86400.0, "1-hour min/avg/max rollups."),
        ),
    ),
    Section(
        "targets",
        "Static scrape targets, one table each.",
        (
            Key("url", "str", None, "Base URL of a gpulens exporter, or the /metrics URL of a dcgm-exporter."),
            Key("name", "str", None, "Target name (default: the URL); used for sharding and health."),
            Key("kind", "str", "gpulens", "What answers at the URL.", choices=("gpulens", "dcgm")),
            Key("node", "str", None, "Node name for a dcgm-exporter page without a hostname label."),
            *_TLS_KEYS,
        ),
        array=True,
    ),
    Section(
        "file_sd",
        "Prometheus file-based service discovery: JSON or YAML files of `{targets: [...], labels: {...}}`, "
        "re-read when they change. A target is `host:port` (scheme `http`, or `__scheme__` in labels) or a URL.",
        (
            Key("files", "list[str]", None, "Files or glob patterns."),
            Key("kind", "str", "gpulens", "What answers at the targets.", choices=("gpulens", "dcgm")),
            *_TLS_KEYS,
        ),
        array=True,
    ),
)
SECTIONS: Final = {s.name: s for s in SCHEMA}
# Sections validated by the component that owns them (the core cannot import it): their text and locator are kept.
DELEGATED: Final = {"alerts": "alert rules, receivers and routes: see docs/alerts.md (validated by the alerts package)"}


# --- typed settings -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TlsAuth:
    username: str | None = None
    password_file: str | None = None
    password_env: str | None = None
    ca_file: str | None = None
    insecure_skip_verify: bool = False

    def password(self) -> str | None:
        """The password, read now (files and variables may be rotated). Raises ConfigError when unreadable."""
        if self.password_file:
            try:
                return Path(self.password_file).read_text(encoding="utf-8").splitlines()[0].strip()
            except (OSError, IndexError, UnicodeDecodeError) as exc:
                raise ConfigError(f"cannot read password_file {self.password_file}: {exc}") from None
        if self.password_env:
            value = os.environ.get(self.password_env)
            if value is None:
                raise ConfigError(f"environment variable {self.password_env} (password_env) is not set")
            return value
        return None


@dataclass(frozen=True)
class TargetSettings:
    url: str
    name: str
    kind: str = "gpulens"
    node: str | None = None
    auth: TlsAuth = field(default_factory=TlsAuth)


@dataclass(frozen=True)
class FileSdSettings:
    files: tuple[str, ...]
    kind: str = "gpulens"
    auth: TlsAuth = field(default_factory=TlsAuth)


@dataclass(frozen=True)
class Settings:
    source: str | None  # the file it came from
    db_url: str
    interval_s: float
    timeout_s: float
    max_response_bytes: int
    concurrency: int
    listen: str
    shard: tuple[int, int]
    spool_dir: str
    spool_max_bytes: int
    future_tolerance_s: float
    retention_raw_s: float
    retention_minute_s: float
    retention_hour_s: float
    targets: tuple[TargetSettings, ...] = ()
    file_sd: tuple[FileSdSettings, ...] = ()
    raw: Mapping[str, Any] = field(default_factory=dict)  # the validated sections, and the delegated ones as parsed
    text: str = ""  # the file's text, for the line numbers of errors found by delegated validators

    @property
    def locator(self) -> TomlLocator:
        return TomlLocator(self.text)


# --- validation -----------------------------------------------------------------------------------------------------

_SHARD = re.compile(r"^(\d+)/(\d+)$")
_LISTEN = re.compile(r"^(\[[0-9a-fA-F:]+\]|[^:\s]*):(\d{1,5})$")


def parse_shard(text: str) -> tuple[int, int]:
    m = _SHARD.match(text.strip())
    if not m or not 0 <= int(m.group(1)) < int(m.group(2)):
        raise ValueError(f"expected I/N with 0 <= I < N, got {text!r}")
    return int(m.group(1)), int(m.group(2))


def _convert(key: Key, value: Any) -> Any:
    kind = key.kind
    if kind in ("str", "listen", "shard"):
        if not isinstance(value, str):
            raise ValueError(f"expected a string, got {type(value).__name__}")
        if kind == "shard":
            parse_shard(value)
        if kind == "listen" and not _LISTEN.match(value):
            raise ValueError(f"expected host:port, got {value!r}")
        if key.choices and value not in key.choices:
            raise ValueError(f"expected one of {', '.join(key.choices)}, got {value!r}")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {value!r}")
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {value!r}")
        number: float = value
    elif kind == "duration":
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ValueError(f'expected a duration such as "30s", got {value!r}')
        number = parse_duration(value)
        value = number
    elif kind == "list[str]":
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
            raise ValueError("expected a non-empty list of strings")
        return tuple(value)
    else:  # pragma: no cover - the schema only uses the kinds above
        raise ValueError(f"unknown kind {kind}")
    if key.minimum is not None and number < key.minimum:
        raise ValueError(f"must be at least {key.minimum:g}, got {value!r}")
    return value


def _validate_table(
    section: Section, table: Any, where: str, locate: Callable[[str | None], int | None], fail: Callable[..., Exception]
) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise fail(f"{where} must be a table", where, locate(None))
    known = {k.name: k for k in section.keys}
    out: dict[str, Any] = {}
    for name, value in table.items():
        key = known.get(name)
        if key is None:
            raise fail(f"unknown key (expected one of {', '.join(known)})", f"{where}.{name}", locate(name))
        try:
            out[name] = _convert(key, value)
        except ValueError as exc:
            raise fail(str(exc), f"{where}.{name}", locate(name)) from None
    for key in section.keys:
        out.setdefault(key.name, key.default)
    return out


def _auth(table: Mapping[str, Any], where: str, fail: Callable[..., Exception], line: int | None) -> TlsAuth:
    if table.get("password_file") and table.get("password_env"):
        raise fail("give password_file or password_env, not both", f"{where}.password_env", line)
    if (table.get("password_file") or table.get("password_env")) and not table.get("username"):
        raise fail("a password needs a username", f"{where}.username", line)
    return TlsAuth(
        username=table.get("username"),
        password_file=table.get("password_file"),
        password_env=table.get("password_env"),
        ca_file=table.get("ca_file"),
        insecure_skip_verify=bool(table.get("insecure_skip_verify")),
    )


def parse_settings(text: str, source: str = "<config>", environ: Mapping[str, str] | None = None) -> Settings:
    """Validate config text. Raises ``ConfigError`` naming the file, the key and the line."""
    env = os.environ if environ is None else environ
    locator = TomlLocator(text)

    def fail(message: str, key: str | None = None, line: int | None = None) -> ConfigError:
        return ConfigError(message, file=source, key=key, line=line)

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+)", str(exc))
        raise fail(f"invalid TOML: {exc}", None, int(m.group(1)) if m else None) from None
    validated: dict[str, Any] = {}
    for name, value in data.items():
        if name in DELEGATED:
            if not isinstance(value, dict):
                raise fail(f"[{name}] must be a table", name, locator.line_of(None, None, name))
            validated[name] = value
            continue
        section = SECTIONS.get(name)
        if section is None:
            expected = ", ".join([*SECTIONS, *DELEGATED])
            raise fail(f"unknown section (expected one of {expected})", name, locator.line_of(name))
        if section.array:
            if not isinstance(value, list):
                raise fail(f"use [[{name}]] tables", name, locator.line_of(None, None, name))
            validated[name] = [
                _validate_table(section, item, f"{name}[{i}]", functools.partial(locator.line_of, name, i), fail)
                for i, item in enumerate(value)
            ]
        else:
            locate = functools.partial(locator.line_of, name, None)
            validated[name] = _validate_table(section, value, name, locate, fail)
    for section in SCHEMA:
        if section.array:
            validated.setdefault(section.name, [])
        else:
            validated.setdefault(section.name, _validate_table(section, {}, section.name, lambda k: None, fail))

    targets = []
    for i, t in enumerate(validated["targets"]):
        line = locator.line_of("targets", i, "url")
        if not t["url"]:
            raise fail("is required", f"targets[{i}].url", locator.line_of("targets", i))
        if not re.match(r"^https?://[^/\s]+", t["url"]):
            raise fail(f"expected an http:// or https:// URL, got {t['url']!r}", f"targets[{i}].url", line)
        targets.append(
            TargetSettings(
                url=t["url"].rstrip("/"),
                name=t["name"] or t["url"].rstrip("/"),
                kind=t["kind"],
                node=t["node"],
                auth=_auth(t, f"targets[{i}]", fail, line),
            )
        )
    names = [t.name for t in targets]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise fail(f"duplicate target name {name!r}", f"targets[{i}].name", locator.line_of("targets", i))
    file_sd = []
    for i, f in enumerate(validated["file_sd"]):
        if not f["files"]:
            raise fail("is required", f"file_sd[{i}].files", locator.line_of("file_sd", i))
        file_sd.append(FileSdSettings(files=f["files"], kind=f["kind"], auth=_auth(f, f"file_sd[{i}]", fail, None)))

    db = validated["database"]
    db_url = env.get("GPULENS_DB_URL") or None
    if db_url is None and db["url_file"]:
        try:
            db_url = Path(db["url_file"]).read_text(encoding="utf-8").strip()
        except OSError as exc:
            line = locator.line_of("database", None, "url_file")
            raise fail(f"cannot read: {exc.strerror}", "database.url_file", line) from None
        except UnicodeDecodeError:
            line = locator.line_of("database", None, "url_file")
            raise fail("cannot read: not UTF-8 text", "database.url_file", line) from None
    col = validated["collector"]
    ret = validated["retention"]
    return Settings(
        source=source,
        db_url=db_url or db["url"],
        interval_s=col["interval"],
        timeout_s=min(col["timeout"], col["interval"]),
        max_response_bytes=col["max_response_bytes"],
        concurrency=col["concurrency"],
        listen=col["listen"],
        shard=parse_shard(col["shard"]),
        spool_dir=col["spool_dir"],
        spool_max_bytes=col["spool_max_bytes"],
        future_tolerance_s=col["future_tolerance"],
        retention_raw_s=ret["raw"],
        retention_minute_s=ret["minute"],
        retention_hour_s=ret["hour"],
        targets=tuple(targets),
        file_sd=tuple(file_sd),
        raw=validated,
        text=text,
    )


def load_settings(path: str | Path, environ: Mapping[str, str] | None = None) -> Settings:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the config file: {exc.strerror or exc}", file=path) from None
    except UnicodeDecodeError:
        raise ConfigError("cannot read the config file: not UTF-8 text (expected a TOML file)", file=path) from None
    return parse_settings(text, str(path), environ)


def default_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings of an empty config file (command-line quick starts)."""
    return parse_settings("", "<defaults>", environ)


# --- the reference --------------------------------------------------------------------------------------------------


def _default_text(key: Key) -> str:
    if key.default is None:
        return "-"
    if key.kind == "duration":
        from gpulens.config import format_duration

        return f'`"{format_duration(key.default)}"`'
    if isinstance(key.default, bool):
        return f"`{str(key.default).lower()}`"
    if isinstance(key.default, str):
        return f'`"{key.default}"`'
    return f"`{key.default}`"


def configuration_reference() -> str:
    lines = [
        "# Configuration reference (`gpulens.toml`)",
        "",
        "Generated from the schema in `gpulens/settings.py` (`python -m gpulens.settings > docs/configuration.md`);",
        "a test keeps it current. `gpulens check-config FILE` validates a file: every error names the file, the key",
        'and the line. Durations are strings like `"30s"`, `"5m"`, `"7d"`.',
        "",
        "Secrets stay out of the file: `GPULENS_DB_URL` overrides `database.url` (or use `database.url_file`), and a",
        "target's password comes from `password_file` or `password_env`. Passwords never appear in logs or errors.",
        "",
    ]
    for section in SCHEMA:
        header = f"[[{section.name}]]" if section.array else f"[{section.name}]"
        lines += [f"## `{header}`", "", section.help, "", "| key | type | default | meaning |", "|---|---|---|---|"]
        for key in section.keys:
            meaning = key.help
            if key.choices:
                meaning += f" One of {', '.join(f'`{c}`' for c in key.choices)}."
            if key.env:
                meaning += f" Environment: `{key.env}`."
            lines.append(f"| `{key.name}` | {key.kind} | {_default_text(key)} | {meaning} |")
        lines.append("")
    for name, text in DELEGATED.items():
        lines += [f"## `[{name}]`", "", f"The {text}.", ""]
    lines += [
        "## Example",
        "",
        "```toml",
        "[database]",
        'url_file = "/run/secrets/gpulens-db-url"   # postgresql+psycopg://gpulens:...@db/gpulens',
        "",
        "[collector]",
        'interval = "10s"',
        'shard = "0/2"                               # this collector scrapes half of the targets',
        "",
        "[[targets]]",
        'url = "http://gpu-node-07:9410"',
        "",
        "[[targets]]",
        'url = "http://gpu-node-08:9400/metrics"     # a dcgm-exporter',
        'kind = "dcgm"',
        "",
        "[[file_sd]]",
        'files = ["/etc/gpulens/targets/*.json"]',
        'username = "prometheus"',
        'password_file = "/etc/gpulens/scrape-password"',
        "```",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(configuration_reference())
