"""The typed reader: TOML and YAML text -> msgspec structs, every failure one ConfigError with file, key and line."""

from __future__ import annotations

from typing import Literal

import msgspec
import pytest

from gpulens.config import ConfigError
from gpulens.typedinput import Duration, FieldError, InputStruct, decode_toml, decode_yaml, input_error, toml_line


class Job(InputStruct, frozen=True, kw_only=True):
    name: str
    gpus: int = 1
    every: Duration = Duration(60.0)
    kind: Literal["train", "serve"] = "train"
    for_: Duration = msgspec.field(default=Duration(0.0), name="for")
    user: str | None = None
    group: str | None = None

    def __post_init__(self) -> None:
        if self.group and not self.user:
            raise FieldError("user", "a group needs a user", line_key="group")


class Cluster(InputStruct, frozen=True):
    step: Duration = Duration(10.0)
    jobs: tuple[Job, ...] = ()


def toml_error(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        decode_toml(text, Cluster, "c.toml")
    return info.value


def test_a_good_file_and_its_defaults() -> None:
    cluster = decode_toml('step = "1m"\n[[jobs]]\nname = "a"\nfor = "5m"\n', Cluster, "c.toml")
    assert cluster.step == 60.0
    assert isinstance(cluster.step, Duration)
    assert cluster.jobs == (Job(name="a", for_=Duration(300.0)),)


@pytest.mark.parametrize(
    ("text", "key", "line", "message"),
    [
        ('step = "1m"\nsteps = 3\n', "steps", 2, "unknown key (expected one of: step, jobs)"),
        (
            '[[jobs]]\nname = "a"\n[[jobs]]\nname = "b"\ngpu = 2\n',
            "jobs[1].gpu",
            5,
            "unknown key (expected one of: name",
        ),
        ('[[jobs]]\nname = "a"\n\ngpus = "two"\n', "jobs[0].gpus", 4, "expected int, got str"),
        ('[[jobs]]\nname = "a"\nevery = "soon"\n', "jobs[0].every", 3, "not a duration: 'soon'"),
        ('[[jobs]]\nname = "a"\nfor = true\n', "jobs[0].for", 3, 'expected a duration such as "30s", got True'),
        ('[[jobs]]\nname = "a"\nkind = "batch"\n', "jobs[0].kind", 3, "expected one of: train, serve, got 'batch'"),
        ("[[jobs]]\ngpus = 2\n", "jobs[0].name", 1, "missing required key"),
        ('[[jobs]]\nname = "a"\ngroup = "g"\n', "jobs[0].user", 3, "a group needs a user"),
        ("jobs = 3\n", "jobs", 1, "expected array, got int"),
        ("step = \n", None, 1, "invalid TOML"),
    ],
)
def test_toml_errors_name_the_file_key_and_line(text: str, key: str | None, line: int, message: str) -> None:
    err = toml_error(text)
    assert (err.file, err.key, err.line) == ("c.toml", key, line)
    assert message in err.message


@pytest.mark.parametrize(
    ("text", "key", "line", "message"),
    [
        ("step: 5s\njobs:\n  - name: a\n  - name: b\n    gpus: many\n", "jobs[1].gpus", 5, "expected int, got str"),
        ("jobs:\n  - name: a\n    gpu: 2\n", "jobs[0].gpu", 3, "unknown key"),
        ("# top\nstep: [1]\n", "step", 2, "expected a duration"),
        ("jobs:\n  - name: [a\n", None, 3, "invalid YAML"),
    ],
)
def test_yaml_errors_name_the_file_key_and_line(text: str, key: str | None, line: int, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        decode_yaml(text, Cluster, "c.yml")
    assert (info.value.file, info.value.key, info.value.line) == ("c.yml", key, line)
    assert message in info.value.message


def test_an_empty_yaml_file_is_the_defaults() -> None:
    assert decode_yaml("# nothing yet\n", Cluster, "c.yml") == Cluster()


def test_errors_found_after_conversion_are_located_too() -> None:
    text = '[alerts]\n[[alerts.routes]]\nreceiver = "a"\n\n[[alerts.routes]]\nreceiver = "b"\n'
    err = input_error("no such receiver", ["alerts", "routes", 1, "receiver"], text=text, source="g.toml")
    assert str(err) == "g.toml:6: alerts.routes[1].receiver: no such receiver"
    assert toml_line(text, ["alerts", "routes", 1]) == 5
    assert toml_line('x = [1, "a"]\n', ["x", 1]) == 1


def test_an_exception_being_handled_does_not_leak_into_the_message() -> None:
    try:
        raise KeyError("unrelated")
    except KeyError:
        err = toml_error("steps = 3\n")
    assert (err.key, err.line, err.message) == ("steps", 1, "unknown key (expected one of: step, jobs)")
