"""The [alerts] config: user rules (and their evaluation), builtin overrides, receivers, routes; errors with lines."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from gpulens.alerts.catalogue import MEMORY_SATURATED
from gpulens.alerts.commandaction import CommandConfig
from gpulens.alerts.config import NOT_WATCHDOG, AlertingConfig, build_notifiers, load_rules_file, parse_alerting
from gpulens.alerts.drain import DrainConfig
from gpulens.alerts.grouping import Route
from gpulens.alerts.notify.slack import SlackNotifier
from gpulens.alerts.notify.webhook import WebhookNotifier
from gpulens.alerts.rules import evaluate
from gpulens.config import ConfigError, TomlLocator

from .support import Feed, healthy_gpu, snapshot

CONFIG = """\
[alerts]
dashboard_url = "https://gpulens.example"

[alerts.builtin.GpuMemorySaturated]
used_ratio = 0.97
for = "10m"

[[alerts.rules]]
name = "GpuHot"
field = "temperature_celsius"
op = ">="
threshold = 85
for = "2m"
keep_firing_for = "1m"
labels = { team = "infra" }
summary = "GPU {node}:{gpu} at {value:.0f} C (limit {threshold:g})"
description = "{field} {op} {threshold} on {uuid}, team {team}"
annotations = { runbook = "https://wiki/{rule}" }

[[alerts.rules]]
name = "JobLowPower"
field = "power_watts"
scope = "job"
aggregate = "avg"
op = "<"
threshold = 100
severity = "info"

[[alerts.receivers]]
name = "ops-slack"
kind = "slack"
url_env = "OPS_SLACK_URL"

[[alerts.receivers]]
name = "am"
kind = "webhook"
url_file = "/run/secrets/am-url"
username = "gpulens"
password_env = "AM_PASSWORD"
timeout = "5s"

[[alerts.routes]]
receiver = "am"
match = ["severity=critical"]
continue = true

[[alerts.routes]]
receiver = "ops-slack"
match = ["node=~node-0[0-3]"]
group_by = ["alertname", "job_id"]
group_wait = "10s"
group_interval = "1m"
repeat_interval = "1h"
"""


def parse(text: str) -> AlertingConfig:
    return parse_alerting(tomllib.loads(text).get("alerts"), source="gpulens.toml", locator=TomlLocator(text))


def test_full_config() -> None:
    config = parse(CONFIG)
    rules = {r.name: r for r in config.rules}
    assert rules[MEMORY_SATURATED].threshold("used_ratio") == 0.97
    assert rules[MEMORY_SATURATED].for_s == 600.0
    hot = rules["GpuHot"]
    assert (hot.for_s, hot.keep_firing_for_s, hot.severity, hot.scope) == (120.0, 60.0, "warning", "gpu")
    assert rules["JobLowPower"].scope == "job"
    assert [r.name for r in config.receivers] == ["ops-slack", "am"]
    assert config.receivers[1].timeout_s == 5.0
    # a webhook receiver is told of incidents, those due at once in one message (``alerts.incidentnotify``)
    assert config.routes[0] == Route("am", config.routes[0].matchers, continue_=True, incidents=True, batch=True)
    assert str(config.routes[0].matchers[0]) == "severity=critical"
    slack_route = config.routes[1]
    assert (slack_route.group_by, slack_route.group_wait_s, slack_route.repeat_interval_s) == (
        ("alertname", "job_id"),
        10.0,
        3600.0,
    )
    assert config.dashboard_url == "https://gpulens.example"
    notifiers = build_notifiers(config.receivers, environ={"OPS_SLACK_URL": "https://hooks.slack.com/x"})
    assert isinstance(notifiers["ops-slack"], SlackNotifier)
    assert isinstance(notifiers["am"], WebhookNotifier)


def test_user_rules_evaluate_with_templates() -> None:
    rules = {r.name: r for r in parse(CONFIG).rules}
    feed = Feed()
    feed.add([snapshot("node-00", [healthy_gpu(temperature_celsius=87.0), healthy_gpu(index=1)], {0: ("j", "u")})])
    [hot] = evaluate([rules["GpuHot"]], feed.history, feed.now)
    assert hot.labels["team"] == "infra"
    assert hot.labels["job_id"] == "j"
    assert hot.summary == "GPU node-00:0 at 87 C (limit 85)"
    assert hot.description == "temperature_celsius >= 85.0 on GPU-node-00-0, team infra"
    assert hot.annotations == {"runbook": "https://wiki/GpuHot"}


def test_job_and_node_scoped_user_rules_aggregate() -> None:
    rules = {r.name: r for r in parse(CONFIG).rules}
    feed = Feed()
    gpus = [healthy_gpu(index=0, power_watts=60.0), healthy_gpu(index=1, power_watts=120.0)]
    feed.add([snapshot("node-00", gpus, {0: ("low", "u"), 1: ("low", "u")})])
    [low] = evaluate([rules["JobLowPower"]], feed.history, feed.now)
    assert low.value == 90.0
    assert low.labels["job_id"] == "low"
    assert "gpu" not in low.labels
    assert low.summary == "job low: power_watts = 90 (< 100)"


def test_derived_fields() -> None:
    text = '[[alerts.rules]]\nname = "Full"\nfield = "memory_used_ratio"\nthreshold = 0.5\nscope = "node"\n'
    [rule] = [r for r in parse("[alerts]\n" + text).rules if r.name == "Full"]
    feed = Feed()
    feed.add([snapshot("node-00", [healthy_gpu(memory_used_bytes=60 << 30)])])
    [c] = evaluate([rule], feed.history, feed.now)
    assert c.value == pytest.approx(0.75)
    assert c.labels["node"] == "node-00"


def test_no_routes_means_every_receiver_gets_everything() -> None:
    config = parse('[alerts]\n[[alerts.receivers]]\nname = "a"\nkind = "webhook"\nurl_env = "A"\n')
    assert config.routes == (Route("a", continue_=True, incidents=True, batch=True),)


def test_defaults_are_the_builtin_catalogue() -> None:
    config = parse_alerting(None)
    # 17 GPU and job rules (JobCommunicationSlow among them), 7 fabric and host rules, 7 node and hardware rules
    # (NvswitchFatalSxid among them), Watchdog
    assert len(config.rules) == 34
    assert config.receivers == ()


RULE = ("[[alerts.rules]]", 'name = "X"', 'field = "power_watts"', "threshold = 1")
SLACK = ("[[alerts.receivers]]", 'name = "s"', 'kind = "slack"')
SLACK_ENV = (*SLACK, 'url_env = "X"')
ROUTE = (*SLACK_ENV, "[[alerts.routes]]", 'receiver = "s"')
BAD = [
    (("[alerts]", 'smtp = "x"'), "alerts.smtp", 2, "unknown key"),
    (
        ("[alerts.builtin.GpuMemorySaturated]", "used_ration = 0.9"),
        "alerts.builtin.GpuMemorySaturated.used_ration",
        2,
        "unknown key",
    ),
    (("[alerts.builtin.NoSuch]", "for = 1"), "alerts.builtin.NoSuch", 1, "unknown builtin rule"),
    (
        ("[[alerts.rules]]", 'name = "X"', 'field = "temp"', "threshold = 1"),
        "alerts.rules[0].field",
        3,
        "unknown field",
    ),
    (RULE[:3], "alerts.rules[0].threshold", 1, "missing"),
    (("[[alerts.rules]]", 'name = "GpuLost"', *RULE[2:]), "alerts.rules[0].name", 2, "builtin"),
    ((*RULE, 'summary = "{value.__class__}"'), "alerts.rules[0].summary", 5, "template field"),
    ((*RULE, 'summary = "{nope}"'), "alerts.rules[0].summary", 5, "unknown template field"),
    ((*RULE, 'for = "soon"'), "alerts.rules[0].for", 5, "not a duration"),
    ((*RULE, *RULE), "alerts.rules[1].name", 6, "defined twice"),
    ((*SLACK, 'url = "https://hooks.slack.com/x"'), "alerts.receivers[0].url", 4, "secret"),
    (
        ("[[alerts.receivers]]", 'name = "s"', 'kind = "email"', 'url_env = "X"'),
        "alerts.receivers[0].kind",
        3,
        "one of",
    ),
    (SLACK, "alerts.receivers[0].url_env", 1, "url_env or url_file"),
    ((*SLACK_ENV, 'url_file = "f"'), "alerts.receivers[0].url_file", 5, "not both"),
    ((*SLACK_ENV, 'password_env = "P"'), "alerts.receivers[0].kind", 3, "no credentials"),
    (("[[alerts.routes]]", 'receiver = "nobody"'), "alerts.routes[0].receiver", 2, "no receiver"),
    ((*ROUTE, 'match = ["node=~("]'), "alerts.routes[0].match", 7, "regular expression"),
    ((*ROUTE, 'group_by = ["...", "node"]'), "alerts.routes[0].group_by", 7, "stands alone"),
    ((*RULE, 'sevrity = "info"'), "alerts.rules[0].sevrity", 5, "unknown key (expected one of: name, field, op"),
    ((*SLACK_ENV, "", 'tiemout = "5s"'), "alerts.receivers[0].tiemout", 6, "unknown key"),
    ((*ROUTE, "contine = true"), "alerts.routes[0].contine", 7, "unknown key"),
    (
        ("[[alerts.rules]]", 'name = "X"', 'field = "power_watts"', 'threshold = "85"'),
        "alerts.rules[0].threshold",
        4,
        "expected float, got str",
    ),
    ((*ROUTE, 'continue = "yes"'), "alerts.routes[0].continue", 7, "expected bool, got str"),
    ((*ROUTE, "group_by = [1]"), "alerts.routes[0].group_by[0]", 7, "expected str, got int"),
    (("[alerts]", "", "receivers = 1"), "alerts.receivers", 3, "expected array, got int"),
]


@pytest.mark.parametrize(("lines", "key", "line", "message"), BAD)
def test_errors_name_the_file_key_and_line(lines: tuple[str, ...], key: str, line: int, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse("\n".join(lines) + "\n")
    assert err.value.file == "gpulens.toml"
    assert err.value.key == key
    assert err.value.line == line
    assert message in err.value.message


def test_rules_file(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text('[[rules]]\nname = "Hot"\nfield = "temperature_celsius"\nthreshold = 80\n')
    [rule] = load_rules_file(path)
    assert rule.name == "Hot"
    path.write_text('[[rules]]\nname = "Hot"\nfield = "temperature_celsius"\n')
    with pytest.raises(ConfigError) as err:
        load_rules_file(path)
    assert (err.value.file, err.value.key, err.value.line) == (str(path), "rules[0].threshold", 1)
    with pytest.raises(ConfigError, match="cannot read"):
        load_rules_file(tmp_path / "missing.toml")


@pytest.mark.parametrize(
    ("text", "key", "line", "message"),
    [
        (
            '[[rules]]\nname = "Hot"\nfield = "temperature_celsius"\nthreshold = 80\nfour = "5m"\n',
            "rules[0].four",
            5,
            "unknown key",
        ),
        ('[[rule]]\nname = "Hot"\n', "rule", 1, "unknown key (expected one of: rules)"),
        (
            '[[rules]]\nname = "Hot"\nfield = "temperature_celsius"\nthreshold = 80\nlabels = "x"\n',
            "rules[0].labels",
            5,
            "expected object, got str",
        ),
        (
            '[alerts]\n[[alerts.rules]]\nname = "Hot"\nfield = "temperature_celsius"\nthreshold = [80]\n',
            "alerts.rules[0].threshold",
            5,
            "expected float, got array",
        ),
    ],
)
def test_rules_file_errors_name_the_key_and_line(tmp_path: Path, text: str, key: str, line: int, message: str) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_rules_file(path)
    assert (err.value.file, err.value.key, err.value.line) == (str(path), key, line)
    assert message in err.value.message


def test_a_slurm_drain_action_is_safe_by_default_and_sees_every_alert_first() -> None:
    config = parse_alerting(tomllib.loads('[[alerts.actions]]\nkind = "slurm-drain"\n')["alerts"])
    (action,) = config.actions
    assert (action.name, action.dry_run, action.max_drained_fraction, action.resume_on_resolve) == (
        "slurm-drain",
        True,
        0.05,
        False,
    )
    assert {"GpuLost", "XidError:79", "XidError:48", "XidError:94", "XidError:95", "XidError:119"} <= set(action.rules)
    assert "EccUncorrectable" in action.rules
    assert isinstance(action, DrainConfig)
    assert (action.requeue, action.breaker_nodes, action.breaker_window_s, action.exclude_nodes) == (
        False,
        0.10,
        600.0,
        (),
    )
    assert config.routes[0] == Route(
        "slurm-drain",
        (NOT_WATCHDOG,),
        group_by=("alertname", "node", "gpu"),
        group_wait_s=0.0,
        group_interval_s=0.0,  # a resolve reaches the action at the next round
        continue_=True,
        incidents=True,  # the action acts on each incident's verdict (alerts.remediationcase)
    )


def test_a_command_action_takes_its_argv_as_a_list() -> None:
    text = '[[alerts.actions]]\nkind = "command"\nname = "ticket"\nargv = ["/usr/local/sbin/t", "--q", "hw"]\n'
    (action,) = parse_alerting(tomllib.loads(text)["alerts"]).actions
    assert action == CommandConfig("ticket", ("/usr/local/sbin/t", "--q", "hw"), action.rules, True, 60.0)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('kind = "slurm-drain"\nmax_drained_fraction = 1.5', "max_drained_fraction"),
        ('kind = "slurm-drain"\nrules = []', "rules"),
        ('kind = "reboot"', "kind"),
        ('kind = "slurm-drain"\nbreaker_nodes = 0', "breaker_nodes"),
        ('kind = "command"', "argv"),
        ('kind = "command"\nargv = ["ticket --queue hw"]', "argv"),
        ('kind = "slurm-drain"\nargv = ["/bin/true"]', "argv"),
    ],
)
def test_a_bad_action_is_a_one_line_error(table: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(f"[[alerts.actions]]\n{table}\n")
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)
