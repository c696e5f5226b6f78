"""The site's own words on a builtin rule: ``runbook_url`` and ``annotations`` overrides.

They are validated where the config is read (``gpulens check-config`` says which key on which line is wrong), every
alert of the rule carries them, its exported Prometheus rules carry them, and they leave the alert's identity (its
fingerprint, from the labels) as it was.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from gpulens.alerts.base import Candidate
from gpulens.alerts.catalogue import MEMORY_SATURATED
from gpulens.alerts.config import AlertingConfig, parse_alerting
from gpulens.alerts.promexport import prometheus_rules
from gpulens.alerts.rules import builtin_rules
from gpulens.alerts.state import fingerprint, step
from gpulens.cli import main
from gpulens.config import ConfigError, TomlLocator

WIKI = "https://wiki.example.org/gpu/memory-saturated"
SITE = f"""\
[alerts.builtin.{MEMORY_SATURATED}]
runbook_url = "{WIKI}"
annotations = {{ team = "ml-infra", oncall = "#gpu-oncall" }}
"""


def parse(text: str) -> AlertingConfig:
    return parse_alerting(tomllib.loads(text).get("alerts"), source="gpulens.toml", locator=TomlLocator(text))


def test_every_alert_of_the_rule_carries_the_sites_runbook_and_annotations_and_keeps_its_identity() -> None:
    rules = {r.name: r for r in parse(SITE).rules}
    rule = rules[MEMORY_SATURATED]
    assert dict(rule.annotations) == {"runbook_url": WIKI, "team": "ml-infra", "oncall": "#gpu-oncall"}
    labels = {"alertname": MEMORY_SATURATED, "severity": rule.severity, "node": "n1", "gpu": "0", "uuid": "GPU-1"}
    candidate = Candidate(MEMORY_SATURATED, labels, 0.99, "memory full", "why")
    result = step({}, [candidate], rules, 100.0)
    [state] = result.states.values()
    assert state.annotations["runbook_url"] == WIKI
    assert (state.annotations["team"], state.annotations["oncall"]) == ("ml-infra", "#gpu-oncall")
    assert state.annotations["summary"] == "memory full"  # the rule's own words stay beside the site's
    assert state.annotations["runbook"]  # the built-in advice stays too
    plain = step({}, [candidate], {r.name: r for r in builtin_rules()}, 100.0)
    assert set(plain.states) == set(result.states) == {fingerprint(labels)}


def test_the_exported_prometheus_rules_carry_them() -> None:
    rules = parse(SITE).rules
    exported = prometheus_rules(rules)
    entries = [r for g in exported["groups"] for r in g["rules"] if r.get("alert") == MEMORY_SATURATED]
    assert entries
    for entry in entries:
        assert entry["annotations"]["runbook_url"] == WIKI
        assert entry["annotations"]["team"] == "ml-infra"
    others = [r for g in exported["groups"] for r in g["rules"] if r.get("alert") not in (None, MEMORY_SATURATED)]
    assert others
    assert all("runbook_url" not in r["annotations"] for r in others)


BAD = [
    ('runbook_url = "wiki/gpu"', "runbook_url", "expected an http:// or https:// URL"),
    ("runbook_url = 3", "runbook_url", "expected an http:// or https:// URL"),
    ('annotations = { summary = "x" }', "annotations", "summary: written by the rule"),
    ('annotations = "team"', "annotations", "expected a table of strings"),
    ('annotations = { runbook_url = "ftp://x" }', "annotations", "expected an http:// or https:// URL"),
    ('annotations = { "a b" = "x" }', "annotations", "expected a name of letters"),
]


@pytest.mark.parametrize(("line", "key", "message"), BAD)
def test_bad_overrides_name_the_key_and_line(line: str, key: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(f"[alerts.builtin.{MEMORY_SATURATED}]\n{line}\n")
    assert err.value.key == f"alerts.builtin.{MEMORY_SATURATED}.{key}"
    assert err.value.line == 2
    assert message in err.value.message


def test_check_config_validates_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.toml"
    good.write_text(SITE)
    assert main(["check-config", str(good)]) == 0
    assert capsys.readouterr().out.startswith(f"{good}: OK")
    bad = tmp_path / "bad.toml"
    bad.write_text(f'[alerts.builtin.{MEMORY_SATURATED}]\nrunbook_url = "wiki/gpu"\n')
    assert main(["check-config", str(bad)]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert f"{bad}:2: alerts.builtin.{MEMORY_SATURATED}.runbook_url: expected an http:// or https:// URL" in line
