from __future__ import annotations

import pytest

from gpulens.config import (
    ConfigError,
    TomlLocator,
    format_duration,
    format_timestamp,
    parse_duration,
    parse_timestamp,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("10s", 10), ("5m", 300), ("1h30m", 5400), ("250ms", 0.25), ("2d", 172800), ("1.5", 1.5), (3, 3.0)],
)
def test_parse_duration(text, seconds) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "ten", "5x", "m5", "-1", "5m garbage", "1h-3m", True])
def test_parse_duration_rejects(text) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_format_duration() -> None:
    assert format_duration(360) == "6m"
    assert format_duration(5400) == "1h30m"
    assert format_duration(42) == "42s"


def test_timestamps_round_trip() -> None:
    t = parse_timestamp("2026-01-01T00:00:00Z")
    assert t == 1767225600.0
    assert format_timestamp(t) == "2026-01-01T00:00:00Z"
    with pytest.raises(ValueError, match="RFC 3339"):
        parse_timestamp("yesterday")


def test_config_error_names_file_key_and_line() -> None:
    err = ConfigError("unknown key", file="a.toml", key="jobs[1].gpus", line=12)
    assert str(err) == "a.toml:12: jobs[1].gpus: unknown key"
    assert (err.file, err.key, err.line) == ("a.toml", "jobs[1].gpus", 12)


TOML = """\
title = "x"

[cluster]
nodes = 4
step = "10s"

[[jobs]]
id = "a"
gpus = ["node-00:0"]

[[jobs]]
id = "b"
  gpus = ["node-01:0"]
"""


def test_toml_locator_finds_keys_in_tables_and_arrays_of_tables() -> None:
    loc = TomlLocator(TOML)
    assert loc.line_of(None, None, "title") == 1
    assert loc.line_of("cluster", None, "step") == 5
    assert loc.line_of("jobs", 0, "gpus") == 9
    assert loc.line_of("jobs", 1, "gpus") == 13
    assert loc.line_of("jobs", 1, "missing") == 11  # falls back to the table header
    assert loc.line_of("faults", 0, "kind") is None
