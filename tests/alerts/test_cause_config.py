"""The site's own rows of the causal table (``[[alerts.causes]]``): a row added in the config groups an alert pair the
builtin table leaves apart into one incident, in the engine; a bad row is one error naming its key and line, also
from ``gpulens check-config``."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from gpulens.alerts.config import AlertingConfig, parse_alerting
from gpulens.alerts.engine import AlertEngine
from gpulens.alerts.state import DEFAULT_INHIBITIONS
from gpulens.cli import main
from gpulens.config import ConfigError, TomlLocator
from tests.alerts.support import STEP, T0, healthy_gpu, snapshot

RULES = """\
[[alerts.rules]]
name = "SiteGpuHot"
field = "temperature_celsius"
op = ">="
threshold = 85
for = "0s"

[[alerts.rules]]
name = "SitePowerHigh"
field = "power_watts"
op = ">="
threshold = 600
for = "0s"
"""
CAUSE = """
[[alerts.causes]]
cause = "SiteGpuHot"
match = ["gpu=0"]
effects = ["SitePowerHigh"]
join = "job_on_gpu"
why = "our hot GPU 0 makes the job's other GPUs draw more"
"""


def parse(text: str) -> AlertingConfig:
    return parse_alerting(tomllib.loads(text).get("alerts"), source="gpulens.toml", locator=TomlLocator(text))


def incidents_of(config: AlertingConfig, hot_gpu: int) -> list[set[str]]:
    """Each incident's rules after a round where GPU ``hot_gpu`` is hot and GPU 1 draws 650 W, both of job llm."""
    site = [r for r in config.rules if r.name.startswith("Site")]  # the builtin rules judge these GPUs too
    engine = AlertEngine(site, causes=config.causes)
    readings = [
        healthy_gpu("node-01", 0, temperature_celsius=90.0 if hot_gpu == 0 else 40.0),
        healthy_gpu("node-01", 1, power_watts=650.0),
        healthy_gpu("node-01", 2, temperature_celsius=90.0 if hot_gpu == 2 else 40.0),
    ]
    jobs = {0: ("llm", "alice"), 1: ("llm", "alice"), 2: ("llm", "alice")}
    outcome = engine.process(T0 + STEP, [snapshot("node-01", readings, jobs)], [])
    assert {s.rule for s in outcome.result.states.values() if s.state == "firing"} == {"SiteGpuHot", "SitePowerHigh"}
    return sorted(({m.rule for m in i.members} for i in outcome.incidents.values()), key=sorted)


def test_a_config_row_groups_an_alert_pair_into_one_incident_where_its_matchers_hold() -> None:
    apart = [{"SiteGpuHot"}, {"SitePowerHigh"}]
    assert incidents_of(parse(RULES), hot_gpu=0) == apart  # the builtin table does not join them
    config = parse(RULES + CAUSE)
    assert [r.join for r in config.causes] == ["job_on_gpu"]
    assert incidents_of(config, hot_gpu=0) == [{"SiteGpuHot", "SitePowerHigh"}]
    assert incidents_of(config, hot_gpu=2) == apart  # match = ["gpu=0"]: a hot GPU 2 explains nothing


BAD = [
    ('cause = "NoSuchRule"', "cause", "no alert rule named 'NoSuchRule'"),
    ('effects = ["SitePowerHigh", "Nope"]', "effects", "no alert rule named 'Nope'"),
    ('join = "same_rack"', "join", "unknown join 'same_rack'"),
    ('match = ["gpu=~("]', "match", "bad regular expression"),
    ('whom = "x"', "whom", "unknown key"),
]


@pytest.mark.parametrize(("line", "key", "message"), BAD)
def test_a_bad_row_names_its_key_and_line(line: str, key: str, message: str) -> None:
    fields = {"cause": '"SiteGpuHot"', "effects": '["SitePowerHigh"]', "join": '"job_on_gpu"'}
    name = line.split(" = ")[0]
    body = [f"{k} = {v}" for k, v in fields.items() if k != name] + [line]
    text = RULES + "\n[[alerts.causes]]\n" + "\n".join(body) + "\n"
    with pytest.raises(ConfigError) as err:
        parse(text)
    assert err.value.key == f"alerts.causes[0].{key}"
    assert err.value.line == text.splitlines().index(line) + 1
    assert message in err.value.message


def test_check_config_validates_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.toml"
    good.write_text(RULES + CAUSE)
    assert main(["check-config", str(good)]) == 0
    assert "1 causal rows" in capsys.readouterr().out
    bad = tmp_path / "bad.toml"
    bad.write_text(RULES + CAUSE.replace("job_on_gpu", "same_rack"))
    assert main(["check-config", str(bad)]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    at = (RULES + CAUSE).splitlines().index('join = "job_on_gpu"') + 1
    assert f"{bad}:{at}: alerts.causes[0].join: unknown join 'same_rack'" in line


INHIBIT = """
[[alerts.inhibitions]]
source = "SiteGpuHot"
equal = ["node"]
targets = ["SitePowerHigh"]
"""


def muted_after_a_round(config: AlertingConfig) -> dict[str, str | None]:
    """Rule -> how it is muted after a round where GPU 0 is hot and GPU 1 draws 650 W on one node."""
    site = [r for r in config.rules if r.name.startswith("Site")]
    engine = AlertEngine(site, inhibitions=(*DEFAULT_INHIBITIONS, *config.inhibitions))
    readings = [
        healthy_gpu("node-01", 0, temperature_celsius=90.0),
        healthy_gpu("node-01", 1, power_watts=650.0),
    ]
    outcome = engine.process(T0 + STEP, [snapshot("node-01", readings, {})], [])
    return {s.rule: s.muted for s in outcome.result.states.values() if s.state == "firing"}


def test_a_config_inhibition_mutes_its_targets_sharing_the_labels() -> None:
    assert muted_after_a_round(parse(RULES)) == {"SiteGpuHot": None, "SitePowerHigh": None}
    config = parse(RULES + INHIBIT)
    assert [(i.source, i.equal, i.targets) for i in config.inhibitions] == [
        ("SiteGpuHot", ("node",), ("SitePowerHigh",))
    ]
    assert muted_after_a_round(config) == {"SiteGpuHot": None, "SitePowerHigh": "inhibited"}
    other_node = parse(RULES + INHIBIT.replace('["node"]', '["gpu"]'))  # GPU 0 and GPU 1 differ: nothing muted
    assert muted_after_a_round(other_node) == {"SiteGpuHot": None, "SitePowerHigh": None}


@pytest.mark.parametrize(
    ("line", "key", "message"),
    [
        ('source = "Nope"', "source", "no alert rule named 'Nope'"),
        ('targets = ["SitePowerHigh", "Gone"]', "targets", "no alert rule named 'Gone'"),
        ("equal = []", "equal", "expected the labels"),
    ],
)
def test_a_bad_inhibition_names_its_key_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, key: str, message: str
) -> None:
    fields = {"source": '"SiteGpuHot"', "equal": '["node"]'}
    name = line.split(" = ")[0]
    body = [f"{k} = {v}" for k, v in fields.items() if k != name] + [line]
    text = RULES + "\n[[alerts.inhibitions]]\n" + "\n".join(body) + "\n"
    with pytest.raises(ConfigError) as err:
        parse(text)
    assert err.value.key == f"alerts.inhibitions[0].{key}"
    assert err.value.line == text.splitlines().index(line) + 1
    assert message in err.value.message
    path = tmp_path / "bad.toml"
    path.write_text(text)
    assert main(["check-config", str(path)]) == 1
    (out,) = capsys.readouterr().err.splitlines()
    assert f"alerts.inhibitions[0].{key}" in out
