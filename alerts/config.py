"""The ``[alerts]`` section of the gpulens config: builtin overrides, user rules, receivers and routes.

```toml
[alerts]
dashboard_url = "https://gpulens.example.org"   # alert links point at its /gpus, /nodes and /jobs pages

[alerts.builtin.GpuMemorySaturated]             # override a builtin rule
used_ratio = 0.97
for = "10m"

[[alerts.rules]]                                # a user rule (see alerts.userrules)
name = "GpuHot"
field = "temperature_celsius"
op = ">="
threshold = 85

[[alerts.receivers]]
name = "ops-slack"
kind = "slack"                                  # slack | webhook
url_env = "GPULENS_SLACK_WEBHOOK_URL"           # or url_file: the URL is a secret, never in the file itself

[[alerts.routes]]
receiver = "ops-slack"
match = ["severity=~critical|warning"]          # label matchers; none: every alert
group_by = ["alertname", "job_id"]
group_wait = "30s"
group_interval = "5m"
repeat_interval = "4h"
```

Every problem is a ``ConfigError`` naming the file, the dotted key and the line.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from gpulens.config import ConfigError, TomlLocator, parse_duration

from .base import AlertRule
from .catalogue import BUILTIN_NAMES
from .grouping import ALL_LABELS, Route
from .matchers import Matcher, MatcherError, parse_matcher
from .notify import HttpPost, Notifier, SecretSource, env_secret, file_secret, urllib_post
from .notify.logfile import LogNotifier
from .notify.slack import SlackNotifier
from .notify.webhook import WebhookNotifier
from .rules import builtin_rules
from .userrules import parse_user_rules

RECEIVER_KINDS: Final = ("slack", "webhook", "log")
_SECTION_KEYS: Final = frozenset({"dashboard_url", "builtin", "rules", "receivers", "routes"})
_RECEIVER_KEYS: Final = frozenset(
    {
        "name",
        "kind",
        "url_env",
        "url_file",
        "timeout",
        "username",
        "password_env",
        "password_file",
        "bearer_token_env",
        "bearer_token_file",
        "path",
    }
)
_ROUTE_KEYS: Final = frozenset(
    {"receiver", "match", "group_by", "group_wait", "group_interval", "repeat_interval", "continue", "send_resolved"}
)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class ReceiverConfig:
    """Where a receiver's secrets come from; the secrets themselves are read at send time."""

    name: str
    kind: str
    url_env: str | None = None
    url_file: str | None = None
    timeout_s: float = 10.0
    username: str | None = None
    password_env: str | None = None
    password_file: str | None = None
    bearer_token_env: str | None = None
    bearer_token_file: str | None = None
    path: str | None = None  # kind = "log": the file that receives one JSON line per notification


@dataclass(frozen=True)
class AlertingConfig:
    rules: tuple[AlertRule, ...]
    receivers: tuple[ReceiverConfig, ...] = ()
    routes: tuple[Route, ...] = ()
    dashboard_url: str | None = None


def parse_alerting(
    data: Mapping[str, Any] | None, *, source: str | None = None, locator: TomlLocator | None = None
) -> AlertingConfig:
    """Validate the ``[alerts]`` table of a parsed config (``None``: the defaults)."""
    return _Parser(data or {}, source, locator).parse()


def load_rules_file(path: str | Path) -> list[AlertRule]:
    """User rules from a file of ``[[rules]]`` tables (or a whole config with ``[[alerts.rules]]``), for
    ``gpulens simulate --rules``. Raises ``ConfigError``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read rules: {exc.strerror or exc}", file=path) from None
    except UnicodeDecodeError:
        raise ConfigError("cannot read rules: not UTF-8 text (expected a TOML file)", file=path) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"TOML syntax error: {exc}", file=path) from None
    locator = TomlLocator(text)
    if "alerts" in data and isinstance(data["alerts"], dict):
        table, items = "alerts.rules", data["alerts"].get("rules", [])
    else:
        unknown = sorted(set(data) - {"rules"})
        if unknown:
            raise ConfigError("unknown key (a rules file holds [[rules]] tables)", file=path, key=unknown[0])
        table, items = "rules", data.get("rules", [])
    return parse_user_rules(items, source=str(path), locator=locator, table=table, reserved=BUILTIN_NAMES)


def build_notifiers(
    receivers: Sequence[ReceiverConfig],
    *,
    dashboard_url: str | None = None,
    environ: Mapping[str, str] | None = None,
    http: HttpPost = urllib_post,
) -> dict[str, Notifier]:
    """A notifier for each configured receiver, by name."""
    notifiers: dict[str, Notifier] = {}
    for r in receivers:
        if r.kind == "log":
            assert r.path is not None
            notifiers[r.name] = LogNotifier(r.path, name=r.name, external_url=dashboard_url or "")
            continue
        url = _secret(r.url_env, r.url_file, environ)
        assert url is not None
        if r.kind == "slack":
            notifiers[r.name] = SlackNotifier(
                url, name=r.name, dashboard_url=dashboard_url, timeout_s=r.timeout_s, http=http
            )
        else:
            notifiers[r.name] = WebhookNotifier(
                url,
                name=r.name,
                external_url=dashboard_url or "",
                timeout_s=r.timeout_s,
                http=http,
                username=r.username,
                password_source=_secret(r.password_env, r.password_file, environ),
                bearer_source=_secret(r.bearer_token_env, r.bearer_token_file, environ),
            )
    return notifiers


def _secret(env: str | None, file: str | None, environ: Mapping[str, str] | None) -> SecretSource | None:
    if env:
        return env_secret(env, environ)
    if file:
        return file_secret(file)
    return None


class _Parser:
    def __init__(self, data: Mapping[str, Any], source: str | None, locator: TomlLocator | None) -> None:
        self.data = data
        self.source = source
        self.locator = locator

    def fail(self, message: str, table: str, index: int | None = None, key: str | None = None) -> ConfigError:
        line = self.locator.line_of(table, index, key) if self.locator else None
        where = table + (f"[{index}]" if index is not None else "") + (f".{key}" if key else "")
        return ConfigError(message, file=self.source, key=where, line=line)

    def parse(self) -> AlertingConfig:
        if not isinstance(self.data, Mapping):
            raise self.fail("expected a table ([alerts])", "alerts")
        for key in self.data:
            if key not in _SECTION_KEYS:
                raise self.fail(
                    f"unknown key (expected one of: {', '.join(sorted(_SECTION_KEYS))})", "alerts", None, key
                )
        dashboard_url = self.data.get("dashboard_url")
        if dashboard_url is not None and not (
            isinstance(dashboard_url, str) and dashboard_url.startswith(("http://", "https://"))
        ):
            raise self.fail("expected an http:// or https:// URL", "alerts", None, "dashboard_url")
        rules = self._builtin() + parse_user_rules(
            self.data.get("rules", []),
            source=self.source,
            locator=self.locator,
            table="alerts.rules",
            reserved=BUILTIN_NAMES,
        )
        receivers = self._receivers()
        routes = self._routes({r.name for r in receivers})
        if receivers and not routes:
            routes = [Route(r.name, continue_=True) for r in receivers]  # no routes: every receiver gets every alert
        return AlertingConfig(tuple(rules), tuple(receivers), tuple(routes), dashboard_url)

    def _builtin(self) -> list[AlertRule]:
        overrides = self.data.get("builtin", {})
        if not isinstance(overrides, Mapping):
            raise self.fail("expected tables such as [alerts.builtin.GpuMemorySaturated]", "alerts", None, "builtin")
        try:
            return builtin_rules(overrides)
        except ConfigError as exc:
            key = exc.key or "alerts.builtin"
            table, _, name = key.rpartition(".")
            located = self.locator.line_of(table, None, name) if self.locator and table else None
            if located is None and self.locator:
                located = self.locator.line_of(key)
            raise ConfigError(exc.message, file=self.source, key=key, line=located) from None

    def _array(self, name: str) -> list[Mapping[str, Any]]:
        items = self.data.get(name, [])
        if not isinstance(items, list) or not all(isinstance(i, Mapping) for i in items):
            raise self.fail(f"use [[alerts.{name}]] tables", "alerts", None, name)
        return items

    def _receivers(self) -> list[ReceiverConfig]:
        out: list[ReceiverConfig] = []
        for i, item in enumerate(self._array("receivers")):
            table = _Table(self, "alerts.receivers", i, item)
            table.reject_unknown(
                _RECEIVER_KEYS,
                "url",
                "put the URL in an environment variable (url_env) or a file (url_file): it is a secret",
            )
            name = table.name("name")
            if any(r.name == name for r in out):
                raise table.fail("name", f"receiver {name!r} is defined twice")
            kind = table.choice("kind", RECEIVER_KINDS)
            path = table.optional_text("path")
            if kind == "log":
                if path is None:
                    raise table.fail("path", "missing required key (the file that receives the notifications)")
                out.append(ReceiverConfig(name=name, kind=kind, path=path))
                continue
            if path is not None:
                raise table.fail("path", "only log receivers take a path")
            url_env, url_file = table.one_of("url_env", "url_file", required=True)
            password_env, password_file = table.one_of("password_env", "password_file")
            token_env, token_file = table.one_of("bearer_token_env", "bearer_token_file")
            if kind == "slack" and any((password_env, password_file, token_env, token_file, item.get("username"))):
                raise table.fail("kind", "Slack receivers take no credentials besides their URL")
            if (password_env or password_file) and (token_env or token_file):
                raise table.fail("bearer_token_env", "give basic auth or a bearer token, not both")
            out.append(
                ReceiverConfig(
                    name=name,
                    kind=kind,
                    url_env=url_env,
                    url_file=url_file,
                    timeout_s=table.duration("timeout", 10.0),
                    username=table.optional_text("username"),
                    password_env=password_env,
                    password_file=password_file,
                    bearer_token_env=token_env,
                    bearer_token_file=token_file,
                )
            )
        return out

    def _routes(self, receivers: set[str]) -> list[Route]:
        out = []
        for i, item in enumerate(self._array("routes")):
            table = _Table(self, "alerts.routes", i, item)
            table.reject_unknown(_ROUTE_KEYS)
            receiver = table.name("receiver")
            if receiver not in receivers:
                raise table.fail("receiver", f"no receiver named {receiver!r} in [[alerts.receivers]]")
            out.append(
                Route(
                    receiver=receiver,
                    matchers=table.matchers("match"),
                    group_by=table.strings("group_by", ("alertname",)),
                    group_wait_s=table.duration("group_wait", 30.0),
                    group_interval_s=table.duration("group_interval", 300.0),
                    repeat_interval_s=table.duration("repeat_interval", 4 * 3600.0),
                    continue_=table.flag("continue", False),
                    send_resolved=table.flag("send_resolved", True),
                )
            )
        return out


class _Table:
    def __init__(self, parser: _Parser, name: str, index: int, data: Mapping[str, Any]) -> None:
        self.parser = parser
        self.table = name
        self.index = index
        self.data = data

    def fail(self, key: str | None, message: str) -> ConfigError:
        return self.parser.fail(message, self.table, self.index, key)

    def reject_unknown(self, allowed: frozenset[str], special: str | None = None, hint: str = "") -> None:
        for key in self.data:
            if key == special:
                raise self.fail(key, hint)
            if key not in allowed:
                raise self.fail(key, f"unknown key (expected one of: {', '.join(sorted(allowed))})")

    def optional_text(self, key: str) -> str | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, f"expected a non-empty string, got {value!r:.40}")
        return value.strip()

    def name(self, key: str) -> str:
        value = self.optional_text(key)
        if value is None:
            raise self.fail(key, "missing required key")
        if not _NAME.match(value):
            raise self.fail(key, f"{value!r} is not a name (letters, digits, '.', '_', '-')")
        return value

    def choice(self, key: str, choices: Sequence[str]) -> str:
        value = self.optional_text(key)
        if value not in choices:
            raise self.fail(key, f"expected one of: {', '.join(choices)}, got {value!r:.40}")
        assert value is not None
        return value

    def one_of(self, first: str, second: str, *, required: bool = False) -> tuple[str | None, str | None]:
        a, b = self.optional_text(first), self.optional_text(second)
        if a and b:
            raise self.fail(second, f"give {first} or {second}, not both")
        if required and not (a or b):
            raise self.fail(first, f"missing: give {first} or {second}")
        return a, b

    def duration(self, key: str, default: float) -> float:
        value = self.data.get(key)
        if value is None:
            return default
        try:
            return parse_duration(value)
        except (TypeError, ValueError) as exc:
            raise self.fail(key, str(exc)) from None

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(key, f"expected true or false, got {value!r:.40}")
        return value

    def strings(self, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self.fail(key, 'expected a list of label names, e.g. ["alertname", "job_id"] (or ["..."])')
        if ALL_LABELS in value and len(value) > 1:
            raise self.fail(key, '"..." (every label) stands alone')
        return tuple(value)

    def matchers(self, key: str) -> tuple[Matcher, ...]:
        value = self.data.get(key, [])
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(key, 'expected a list of matchers, e.g. ["severity=critical", "node=~node-0[1-3]"]')
        try:
            return tuple(parse_matcher(v) for v in value)
        except MatcherError as exc:
            raise self.fail(key, str(exc)) from None
