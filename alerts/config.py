"""The ``[alerts]`` section of the gpulens config: builtin overrides, user rules, receivers and routes.

```toml
[alerts]
dashboard_url = "https://gpulens.example.org"   # alert links point at its /gpus, /nodes and /jobs pages

[alerts.builtin.GpuMemorySaturated]             # override a builtin rule
used_ratio = 0.97
for = "10m"

[[alerts.rules]]                                # a user rule (see gpulens.alerts.userrules)
name = "GpuHot"
field = "temperature_celsius"
op = ">="
threshold = 85

[[alerts.receivers]]
name = "ops-slack"
kind = "slack"                                  # slack | webhook | alertmanager | log
url_env = "GPULENS_SLACK_WEBHOOK_URL"           # or url_file: the URL is a secret, never in the file itself

[[alerts.receivers]]
name = "am"
kind = "alertmanager"                           # POSTs to /api/v2/alerts of each URL, again every resend_interval
url_env = ["GPULENS_AM_URL_A", "GPULENS_AM_URL_B"]  # an HA pair: each URL gets every alert

[[alerts.routes]]
receiver = "ops-slack"
match = ["severity=~critical|warning"]          # label matchers; none: every alert
group_by = ["alertname", "job_id"]
group_wait = "30s"
group_interval = "5m"
repeat_interval = "4h"
```

Routes to an alertmanager receiver take no ``group_wait``, ``group_interval`` or ``repeat_interval``: Alertmanager
groups for itself, and gpulens sends a firing alert at once and again every ``resend_interval`` (1m), as Prometheus
does. The ``Watchdog`` goes to webhook and alertmanager receivers only, never to Slack, a log or an action.

Every problem is a ``ConfigError`` naming the file, the dotted key and the line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, Literal

import msgspec

from gpulens.alerts.base import AlertRule
from gpulens.alerts.catalogue import BUILTIN_NAMES, WATCHDOG
from gpulens.alerts.causeconfig import CauseFile, InhibitionFile, build_causes, build_inhibitions
from gpulens.alerts.causes import Explains
from gpulens.alerts.commandaction import COMMAND_KIND, CommandConfig
from gpulens.alerts.drain import DEFAULT_RULES, DRAIN_KIND, DrainConfig
from gpulens.alerts.grouping import ALL_LABELS, Route
from gpulens.alerts.matchers import MatcherError, parse_matcher
from gpulens.alerts.notify import HttpPost, Notifier, SecretSource, env_secret, file_secret, urllib_post
from gpulens.alerts.notify.alertmanager import DEFAULT_RESEND_S, AlertmanagerNotifier, lease_s
from gpulens.alerts.notify.logfile import LogNotifier
from gpulens.alerts.notify.slack import SlackNotifier
from gpulens.alerts.notify.webhook import WebhookNotifier
from gpulens.alerts.rules import builtin_rules
from gpulens.alerts.state import Inhibition
from gpulens.alerts.userrules import RuleFile, build_user_rules, parse_user_rules
from gpulens.config import ConfigError, TomlLocator
from gpulens.typedinput import (
    Duration,
    FieldError,
    InputStruct,
    convert,
    input_error,
    parse_toml,
    read_text,
)

RECEIVER_KINDS: Final = ("slack", "webhook", "alertmanager", "log")
# Receiver kinds the Watchdog reaches: machines that watch for it to stop (people are not paged by it).
WATCHDOG_KINDS: Final = ("webhook", "alertmanager")
# Receiver kinds that get one message per incident (``alerts.incidentnotify``); Alertmanager groups by itself.
INCIDENT_KINDS: Final = ("slack", "webhook", "log")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class ReceiverConfig:
    """Where a receiver's secrets come from; the secrets themselves are read at send time."""

    name: str
    kind: str
    url_env: tuple[str, ...] = ()  # one variable per URL (several: an alertmanager receiver's HA peers)
    url_file: tuple[str, ...] = ()
    timeout_s: float = 10.0
    username: str | None = None
    password_env: str | None = None
    password_file: str | None = None
    bearer_token_env: str | None = None
    bearer_token_file: str | None = None
    path: str | None = None  # kind = "log": the file that receives one JSON line per notification
    resend_s: float = DEFAULT_RESEND_S  # kind = "alertmanager": how often a firing alert is sent again

    def destinations(self) -> tuple[str, ...]:
        """The receiver's outbox destinations: its name, or ``name#1``, ``name#2``, ... one per URL."""
        count = len(self.url_env or self.url_file)
        return (self.name,) if count <= 1 else tuple(f"{self.name}#{i}" for i in range(1, count + 1))


@dataclass(frozen=True)
class AlertingConfig:
    rules: tuple[AlertRule, ...]
    receivers: tuple[ReceiverConfig, ...] = ()
    routes: tuple[Route, ...] = ()
    dashboard_url: str | None = None
    actions: tuple[DrainConfig | CommandConfig, ...] = ()  # [[alerts.actions]]: slurm-drain and command actions
    causes: tuple[Explains, ...] = ()  # [[alerts.causes]]: the site's rows of the causal table (alerts.causeconfig)
    inhibitions: tuple[Inhibition, ...] = ()  # [[alerts.inhibitions]]: after the builtin ones (alerts.causeconfig)

    def destinations(self) -> dict[str, tuple[str, ...]]:
        """Each receiver's outbox destinations (one per URL), by receiver name."""
        return {r.name: r.destinations() for r in self.receivers}


# --- the [alerts] tables as written ---------------------------------------------------------------------------------


def _name(key: str, value: str) -> None:
    if not _NAME.match(value):
        raise FieldError(key, f"{value!r} is not a name (letters, digits, '.', '_', '-')")


def _one_of(first: str, a: object, second: str, b: object) -> None:
    if a and b:
        raise FieldError(second, f"give {first} or {second}, not both")


class ReceiverFile(InputStruct, frozen=True, kw_only=True):
    """One ``[[alerts.receivers]]`` table."""

    name: str
    kind: Literal["slack", "webhook", "alertmanager", "log"]
    url: str | None = None  # refused: the URL is a secret
    url_env: str | tuple[str, ...] | None = None  # several: an alertmanager receiver's HA peers
    url_file: str | tuple[str, ...] | None = None
    timeout: Duration = Duration(10.0)
    username: str | None = None
    password_env: str | None = None
    password_file: str | None = None
    bearer_token_env: str | None = None
    bearer_token_file: str | None = None
    path: str | None = None
    resend_interval: Duration | None = None

    def __post_init__(self) -> None:
        if self.url is not None:
            raise FieldError(
                "url", "put the URL in an environment variable (url_env) or a file (url_file): it is a secret"
            )
        _name("name", self.name)
        if self.kind == "log":
            if not self.path:
                raise FieldError("path", "missing required key (the file that receives the notifications)")
            return
        if self.path is not None:
            raise FieldError("path", "only log receivers take a path")
        if self.resend_interval is not None and (self.kind != "alertmanager" or self.resend_interval <= 0):
            raise FieldError("resend_interval", "only alertmanager receivers take one, above 0")
        _one_of("url_env", self.url_env, "url_file", self.url_file)
        if not (self.url_env or self.url_file):
            raise FieldError("url_env", "missing: give url_env or url_file")
        for key, value in (("url_env", self.url_env), ("url_file", self.url_file)):
            if isinstance(value, tuple) and self.kind != "alertmanager":
                raise FieldError(key, "only alertmanager receivers take several URLs")
            if isinstance(value, tuple) and not all(value):
                raise FieldError(key, "expected names, one per URL")
        _one_of("password_env", self.password_env, "password_file", self.password_file)
        _one_of("bearer_token_env", self.bearer_token_env, "bearer_token_file", self.bearer_token_file)
        basic = self.password_env or self.password_file
        bearer = self.bearer_token_env or self.bearer_token_file
        if self.kind == "slack" and (basic or bearer or self.username):
            raise FieldError("kind", "Slack receivers take no credentials besides their URL")
        if basic and bearer:
            raise FieldError("bearer_token_env", "give basic auth or a bearer token, not both")

    def config(self) -> ReceiverConfig:
        if self.kind == "log":
            return ReceiverConfig(name=self.name, kind=self.kind, path=self.path)
        return ReceiverConfig(
            name=self.name,
            kind=self.kind,
            url_env=_listed(self.url_env),
            url_file=_listed(self.url_file),
            timeout_s=float(self.timeout),
            username=self.username or None,
            password_env=self.password_env or None,
            password_file=self.password_file or None,
            bearer_token_env=self.bearer_token_env or None,
            bearer_token_file=self.bearer_token_file or None,
            resend_s=DEFAULT_RESEND_S if self.resend_interval is None else float(self.resend_interval),
        )


def _listed(value: str | tuple[str, ...] | None) -> tuple[str, ...]:
    return () if not value else (value,) if isinstance(value, str) else value


class ActionFile(InputStruct, frozen=True, kw_only=True):
    """One ``[[alerts.actions]]`` table: ``kind = "slurm-drain"`` (gpulens.alerts.drain) or ``kind = "command"``
    (gpulens.alerts.commandaction, with ``argv``)."""

    kind: Literal["slurm-drain", "command"]
    name: str = ""
    rules: tuple[str, ...] = DEFAULT_RULES
    dry_run: bool = True
    max_drained_fraction: float = 0.05
    cooldown: Duration = Duration(3600.0)
    resume_on_resolve: bool = False
    requeue: bool = False
    exclude_nodes: tuple[str, ...] = ()
    exclude_features: tuple[str, ...] = ()
    breaker_nodes: float = 0.10
    breaker_window: Duration = Duration(600.0)
    argv: tuple[str, ...] = ()
    scontrol: str = "scontrol"
    sinfo: str = "sinfo"
    timeout: Duration | None = None

    def __post_init__(self) -> None:
        _name("name", self.name or self.kind)
        if not 0 < self.max_drained_fraction <= 1:
            raise FieldError("max_drained_fraction", "expected a fraction of the nodes, above 0 and at most 1")
        if not 0 < self.breaker_nodes <= 1:
            raise FieldError("breaker_nodes", "expected a fraction of the nodes, above 0 and at most 1")
        if not self.rules:
            raise FieldError("rules", "expected at least one rule (Rule or Rule:xid)")
        if self.kind == COMMAND_KIND and (not self.argv or not self.argv[0].startswith("/")):
            raise FieldError("argv", "expected the program's absolute path and its first arguments, as a list")
        if self.kind == DRAIN_KIND and self.argv:
            raise FieldError("argv", "only a command action runs a program of its own")

    def config(self) -> DrainConfig | CommandConfig:
        name = self.name or self.kind
        if self.kind == COMMAND_KIND:
            timeout = 60.0 if self.timeout is None else float(self.timeout)
            return CommandConfig(name, tuple(self.argv), tuple(self.rules), self.dry_run, timeout)
        return DrainConfig(
            name=name,
            rules=tuple(self.rules),
            dry_run=self.dry_run,
            max_drained_fraction=self.max_drained_fraction,
            cooldown_s=float(self.cooldown),
            resume_on_resolve=self.resume_on_resolve,
            requeue=self.requeue,
            exclude_nodes=tuple(self.exclude_nodes),
            exclude_features=tuple(self.exclude_features),
            breaker_nodes=self.breaker_nodes,
            breaker_window_s=float(self.breaker_window),
            scontrol=self.scontrol,
            sinfo=self.sinfo,
            timeout_s=10.0 if self.timeout is None else float(self.timeout),
        )


class RouteFile(InputStruct, frozen=True, kw_only=True):
    """One ``[[alerts.routes]]`` table."""

    receiver: str
    match: str | tuple[str, ...] = ()
    group_by: tuple[str, ...] = ("alertname",)
    # None: Route's defaults (30s, 5m, 4h); routes to an alertmanager receiver take none of the three
    group_wait: Duration | None = None
    group_interval: Duration | None = None
    repeat_interval: Duration | None = None
    continue_: bool = msgspec.field(default=False, name="continue")
    send_resolved: bool = True

    def __post_init__(self) -> None:
        _name("receiver", self.receiver)
        self.route()  # the matchers parse
        if not all(self.group_by):
            raise FieldError("group_by", 'expected a list of label names, e.g. ["alertname", "job_id"] (or ["..."])')
        if ALL_LABELS in self.group_by and len(self.group_by) > 1:
            raise FieldError("group_by", '"..." (every label) stands alone')

    def route(self) -> Route:
        try:
            matchers = tuple(parse_matcher(m) for m in ((self.match,) if isinstance(self.match, str) else self.match))
        except MatcherError as exc:
            raise FieldError("match", str(exc)) from None
        route = Route(
            receiver=self.receiver,
            matchers=matchers,
            group_by=self.group_by,
            continue_=self.continue_,
            send_resolved=self.send_resolved,
        )
        if self.group_wait is not None:
            route = replace(route, group_wait_s=float(self.group_wait))
        if self.group_interval is not None:
            route = replace(route, group_interval_s=float(self.group_interval))
        if self.repeat_interval is not None:
            route = replace(route, repeat_interval_s=float(self.repeat_interval))
        return route


class AlertsFile(InputStruct, frozen=True):
    """The ``[alerts]`` table; ``builtin`` overrides are checked against the catalogue by ``builtin_rules``."""

    dashboard_url: str | None = None
    builtin: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    rules: tuple[RuleFile, ...] = ()
    receivers: tuple[ReceiverFile, ...] = ()
    routes: tuple[RouteFile, ...] = ()
    actions: tuple[ActionFile, ...] = ()
    causes: tuple[CauseFile, ...] = ()
    inhibitions: tuple[InhibitionFile, ...] = ()

    def __post_init__(self) -> None:
        if self.dashboard_url is not None and not self.dashboard_url.startswith(("http://", "https://")):
            raise FieldError("dashboard_url", "expected an http:// or https:// URL")


class RulesFile(InputStruct, frozen=True):
    """A rules file (``gpulens simulate --rules``): ``[[rules]]`` tables."""

    rules: tuple[RuleFile, ...] = ()


# --- validation -----------------------------------------------------------------------------------------------------


def parse_alerting(
    data: Mapping[str, Any] | None, *, source: str | None = None, locator: TomlLocator | None = None
) -> AlertingConfig:
    """Validate the ``[alerts]`` table of a parsed config (``None``: the defaults)."""
    text = locator.text if locator is not None else ""
    at = ["alerts"]
    file = convert({} if data is None else data, AlertsFile, text=text, source=source, at=at)
    rules = _builtin(file.builtin, source, locator) + build_user_rules(
        file.rules, at=[*at, "rules"], text=text, source=source, reserved=BUILTIN_NAMES
    )
    receivers: list[ReceiverConfig] = []
    for i, r in enumerate(file.receivers):
        if any(other.name == r.name for other in receivers):
            raise input_error(
                f"receiver {r.name!r} is defined twice", [*at, "receivers", i, "name"], text=text, source=source
            )
        receivers.append(r.config())
    by_name = {r.name: r for r in receivers}
    routes: list[Route] = []
    for i, route in enumerate(file.routes):
        receiver = by_name.get(route.receiver)
        if receiver is None:
            raise input_error(
                f"no receiver named {route.receiver!r} in [[alerts.receivers]]",
                [*at, "routes", i, "receiver"],
                text=text,
                source=source,
            )
        timing = [k for k in ("group_wait", "group_interval", "repeat_interval") if getattr(route, k) is not None]
        if receiver.kind == "alertmanager" and timing:
            raise input_error(
                "routes to an alertmanager receiver take no timing: Alertmanager groups the alerts itself, gpulens "
                "sends them at once and again every resend_interval of the receiver",
                [*at, "routes", i, timing[0]],
                text=text,
                source=source,
            )
        routes.append(_for_receiver(route.route(), receiver))
    if receivers and not routes:  # no routes: every receiver gets every alert
        routes = [_for_receiver(Route(r.name, continue_=True), r) for r in receivers]
    actions: list[DrainConfig | CommandConfig] = []
    for i, a in enumerate(file.actions):
        name = a.name or a.kind
        if name in {r.name for r in receivers} | {other.name for other in actions}:
            where: list[str | int] = [*at, "actions", i, "name"]
            raise input_error(f"{name!r} names a receiver or another action", where, text=text, source=source)
        actions.append(a.config())
    # Each action sees every incident at once (it picks its rules among the members itself), before and whatever the
    # routes, and each change at the next round (no group_interval: a resolve must not wait five minutes to resume a
    # node). It acts on the incident's culprit and action, once per incident (alerts.remediationcase).
    routes = [
        *(
            Route(
                a.name,
                (NOT_WATCHDOG,),
                group_by=("alertname", "node", "gpu"),
                group_wait_s=0.0,
                group_interval_s=0.0,
                continue_=True,
                incidents=True,
            )
            for a in actions
        ),
        *routes,
    ]
    names = {r.name for r in rules}
    causes = build_causes(file.causes, rules=names, at=[*at, "causes"], text=text, source=source)
    muted = build_inhibitions(file.inhibitions, rules=names, at=[*at, "inhibitions"], text=text, source=source)
    return AlertingConfig(
        tuple(rules), tuple(receivers), tuple(routes), file.dashboard_url, tuple(actions), causes, muted
    )


NOT_WATCHDOG: Final = parse_matcher(f"alertname!={WATCHDOG}")


def _for_receiver(route: Route, receiver: ReceiverConfig) -> Route:
    """A route as its receiver's kind needs it: an alertmanager receiver gets each firing alert at once and again
    every ``resend_s`` (Alertmanager does the grouping); only webhook and alertmanager receivers get the Watchdog."""
    if receiver.kind == "alertmanager":
        route = replace(route, group_wait_s=0.0, group_interval_s=0.0, repeat_interval_s=receiver.resend_s)
    if receiver.kind not in WATCHDOG_KINDS:
        route = replace(route, matchers=(NOT_WATCHDOG, *route.matchers))
    if receiver.kind in INCIDENT_KINDS:
        route = replace(route, incidents=True, batch=True)
    return route


def _builtin(overrides: Mapping[str, Any], source: str | None, locator: TomlLocator | None) -> list[AlertRule]:
    try:
        return builtin_rules(overrides)
    except ConfigError as exc:
        key = exc.key or "alerts.builtin"
        table, _, name = key.rpartition(".")
        located = locator.line_of(table, None, name) if locator and table else None
        if located is None and locator:
            located = locator.line_of(key)
        raise ConfigError(exc.message, file=source, key=key, line=located) from None


def load_rules_file(path: str | Path) -> list[AlertRule]:
    """User rules from a file of ``[[rules]]`` tables (or a whole config with ``[[alerts.rules]]``), for
    ``gpulens simulate --rules``. Raises ``ConfigError``."""
    source = str(path)
    text = read_text(path)
    data = parse_toml(text, source)
    if isinstance(data.get("alerts"), dict):
        items = data["alerts"].get("rules", [])
        return parse_user_rules(items, source=source, locator=TomlLocator(text), reserved=BUILTIN_NAMES)
    file = convert(data, RulesFile, text=text, source=source)
    return build_user_rules(file.rules, at=["rules"], text=text, source=source, reserved=BUILTIN_NAMES)


def build_notifiers(
    receivers: Sequence[ReceiverConfig],
    *,
    dashboard_url: str | None = None,
    environ: Mapping[str, str] | None = None,
    http: HttpPost = urllib_post,
    eval_interval_s: float = 10.0,
) -> dict[str, Notifier]:
    """A notifier for each outbox destination of the configured receivers (``ReceiverConfig.destinations``): one per
    receiver, or one per URL of an alertmanager receiver. ``eval_interval_s``: the rules' interval (Alertmanager's
    ``endsAt`` lies 4 x max(resend interval, it) ahead)."""
    notifiers: dict[str, Notifier] = {}
    for r in receivers:
        if r.kind == "log":
            assert r.path is not None
            notifiers[r.name] = LogNotifier(r.path, name=r.name, external_url=dashboard_url or "")
            continue
        urls = [env_secret(v, environ) for v in r.url_env] or [file_secret(f) for f in r.url_file]
        if r.kind == "slack":
            notifiers[r.name] = SlackNotifier(
                urls[0], name=r.name, dashboard_url=dashboard_url, timeout_s=r.timeout_s, http=http
            )
            continue
        auth: dict[str, Any] = {
            "external_url": dashboard_url or "",
            "timeout_s": r.timeout_s,
            "http": http,
            "username": r.username,
            "password_source": _secret(r.password_env, r.password_file, environ),
            "bearer_source": _secret(r.bearer_token_env, r.bearer_token_file, environ),
        }
        if r.kind == "webhook":
            notifiers[r.name] = WebhookNotifier(urls[0], name=r.name, **auth)
            continue
        lease = lease_s(r.resend_s, eval_interval_s)
        for destination, url in zip(r.destinations(), urls, strict=True):
            notifiers[destination] = AlertmanagerNotifier(url, name=destination, lease_s=lease, **auth)
    return notifiers


def _secret(env: str | None, file: str | None, environ: Mapping[str, str] | None) -> SecretSource | None:
    if env:
        return env_secret(env, environ)
    if file:
        return file_secret(file)
    return None
