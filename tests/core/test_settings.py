from __future__ import annotations

from pathlib import Path

import pytest

from gpulens.config import ConfigError
from gpulens.configdoc import configuration_reference
from gpulens.settings import load_settings, parse_settings

GOOD = """\
[database]
url = "sqlite:///x.db"

[collector]
interval = "5s"
timeout = "4s"
shard = "1/3"

[[targets]]
url = "http://gpu-node-07:9410/"

[[targets]]
url = "http://gpu-node-08:9400/metrics"
kind = "dcgm"
name = "node-08-dcgm"
username = "prom"
password_env = "SCRAPE_PW"

[[file_sd]]
files = ["/etc/gpulens/targets/*.json"]
"""


def test_a_good_config_and_its_defaults() -> None:
    s = parse_settings(GOOD, "g.toml", environ={})
    assert s.db_url == "sqlite:///x.db"
    assert s.interval_s == 5.0
    assert s.timeout_s == 4.0
    assert s.shard == (1, 3)
    assert s.retention_raw_s == 7 * 86400
    assert [t.url for t in s.targets] == ["http://gpu-node-07:9410", "http://gpu-node-08:9400/metrics"]
    assert s.targets[0].name == "http://gpu-node-07:9410"
    assert s.targets[1].kind == "dcgm"
    assert s.file_sd[0].files == ("/etc/gpulens/targets/*.json",)


def test_the_environment_overrides_the_database_url() -> None:
    s = parse_settings(GOOD, "g.toml", environ={"GPULENS_DB_URL": "postgresql+psycopg://u:pw@h/db"})
    assert s.db_url == "postgresql+psycopg://u:pw@h/db"


def test_url_file_keeps_the_password_out_of_the_config(tmp_path: Path) -> None:
    secret = tmp_path / "url"
    secret.write_text("postgresql+psycopg://u:pw@h/db\n")
    s = parse_settings(f'[database]\nurl_file = "{secret}"\n', "g.toml", environ={})
    assert s.db_url == "postgresql+psycopg://u:pw@h/db"


@pytest.mark.parametrize(
    ("text", "key", "line"),
    [
        ('[collector]\ninterval = "soon"\n', "collector.interval", 2),
        ('[collector]\n\ninterval = "0s"\n', "collector.interval", 3),
        ('[collector]\nshard = "3/3"\n', "collector.shard", 2),
        ('[collector]\ninterval = "2s"\ntimeout = "3s"\n', "collector.timeout", 3),
        ('[collector]\nlisten = "nowhere"\n', "collector.listen", 2),
        ("[colector]\n", "colector", 1),
        ('[[targets]]\nurl = "http://a:1"\n[[targets]]\nurl = "http://b:1"\nkind = "snmp"\n', "targets[1].kind", 5),
        ('[[targets]]\nurl = "ftp://a"\n', "targets[0].url", 2),
        ('[[targets]]\nname = "x"\n', "targets[0].url", 1),
        ('[[targets]]\nurl = "http://a:1"\nbogus = 1\n', "targets[0].bogus", 3),
        ('[[targets]]\nurl = "http://a:1"\npassword_env = "X"\n', "targets[0].username", 2),
        ('[[targets]]\nurl = "http://a:1"\n[[targets]]\nurl = "http://a:1"\n', "targets[1].name", 3),
        ("[database]\nurl = 5\n", "database.url", 2),
        ("targets = 3\n", "targets", 1),
        ('[retention]\nraw = "7d"\n\nhourly = "1d"\n', "retention.hourly", 4),
        ('[collector]\nconcurrency = "64"\n', "collector.concurrency", 2),
        ('[[targets]]\nurl = "http://a:1"\ninsecure_skip_verify = "yes"\n', "targets[0].insecure_skip_verify", 3),
        ('[[file_sd]]\nfiles = "a.json"\n', "file_sd[0].files", 2),
        ('[[file_sd]]\nfiles = ["a.json", 3]\n', "file_sd[0].files[1]", 2),
    ],
)
def test_errors_name_the_file_the_key_and_the_line(text: str, key: str, line: int) -> None:
    with pytest.raises(ConfigError) as info:
        parse_settings(text, "bad.toml", environ={})
    assert (info.value.file, info.value.key, info.value.line) == ("bad.toml", key, line)
    assert str(info.value).startswith(f"bad.toml:{line}: {key}: ")


def test_unknown_keys_list_the_keys_the_table_takes() -> None:
    with pytest.raises(ConfigError) as info:
        parse_settings('[collector]\ninterval = "5s"\nintervall = "5s"\n', "bad.toml", environ={})
    assert str(info.value).startswith("bad.toml:3: collector.intervall: unknown key (expected one of: interval, ")


def test_wrong_types_name_the_expected_type() -> None:
    with pytest.raises(ConfigError) as info:
        parse_settings('[collector]\nconcurrency = "64"\n', "bad.toml", environ={})
    assert str(info.value) == "bad.toml:2: collector.concurrency: expected int, got str"


def test_toml_syntax_errors_carry_the_line() -> None:
    with pytest.raises(ConfigError) as info:
        parse_settings("[collector]\ninterval = \n", "bad.toml", environ={})
    assert info.value.line == 2


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path / "missing.toml")


def test_the_configuration_reference_is_current() -> None:
    doc = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
    assert doc.read_text() == configuration_reference(), (
        "regenerate: python -m gpulens.configdoc > docs/configuration.md"
    )


@pytest.mark.parametrize(("interval", "timeout_s"), [("2s", 1.6), ("10s", 8.0), ("60s", 10.0)])
def test_the_default_timeout_leaves_room_before_the_next_tick(interval: str, timeout_s: float) -> None:
    s = parse_settings(f'[collector]\ninterval = "{interval}"\n', "g.toml", environ={})
    assert s.timeout_s == pytest.approx(timeout_s)  # min(10 s, 0.8 x interval)


def test_a_timeout_above_the_interval_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as info:
        parse_settings('[collector]\ninterval = "2s"\ntimeout = "2.5s"\n', "g.toml", environ={})
    message = str(info.value)
    assert message.startswith("g.toml:3: collector.timeout: 2.5s is longer than the interval (2s)")
    assert "\n" not in message
    equal = parse_settings('[collector]\ninterval = "2s"\ntimeout = "2s"\n', "g.toml", environ={})
    assert equal.timeout_s == 2.0  # at most the interval, as Prometheus allows
