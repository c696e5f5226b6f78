"""Bad input on the command line, as a new user types it: every bad flag, URL, file or environment twin ends in one
line that names the value (exit 2 for a usage error, 1 otherwise), never a traceback, never a password.

Each case runs the real CLI in a subprocess and fails before anything is served: a PostgreSQL URL points at the
closed port 127.0.0.1:1 (refused at once), an address that cannot be bound is TEST-NET-3's 203.0.113.1.
"""

from __future__ import annotations

import os
import shlex
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECRET = "hunter2"
PLACES = {
    "scenario": str(ROOT / "examples" / "scenarios" / "healthy.toml"),
    "pg": f"postgresql+psycopg://gpulens:{SECRET}@127.0.0.1:1/gpulens",  # nothing listens on port 1
    "nohost": "203.0.113.1",  # TEST-NET-3: no host has it, so it cannot be bound
}
ACCEPTED = ("sqlite:///", "postgresql+psycopg://")


@dataclass(frozen=True)
class Case:
    """``gpulens <line>`` with ``env``: exits ``status`` with one stderr line holding every needle.

    ``{tmp}`` is a directory of prepared files, ``{busy}`` a port something listens on, and ``PLACES`` the rest.
    """

    line: str
    status: int
    needles: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return " ".join([*(f"{k}={v}" for k, v in self.env.items()), self.line])


def case(line: str, status: int, *needles: str, env: dict[str, str] | None = None) -> Case:
    return Case(line, status, needles, env or {})


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    tmp = tmp_path_factory.mktemp("bad-input")
    (tmp / "invalid.toml").write_text("x = [\n")
    (tmp / "binary.toml").write_bytes(b"\xff\xfe\x00")
    (tmp / "a-directory").mkdir()
    (tmp / "a-file").write_text("not a directory\n")
    (tmp / "bad-db-url.toml").write_text('[database]\nurl = "postgress://gpulens@db/gpulens"\n')
    (tmp / "bad-listen.toml").write_text('[collector]\nlisten = "nowhere"\n')
    (tmp / "unknown-rule.toml").write_text('[alerts.builtin.Nope]\nfor = "1m"\n')
    (tmp / "bad-rules.toml").write_text('[[rules]]\nname = "x"\n')
    (tmp / "bad-kind.toml").write_text('[[alerts.receivers]]\nname = "ops"\nkind = "pager"\n')
    (tmp / "log-receiver.toml").write_text(f'[[alerts.receivers]]\nname = "ops"\nkind = "log"\npath = "{tmp}/a.log"\n')
    (tmp / "bad-web.yml").write_text("nope: 1\n")
    (tmp / "htpasswd").write_text("bob\n")
    with sqlite3.connect(tmp / "not-gpulens.db") as conn:
        conn.execute("CREATE TABLE x (a)")
    conn.close()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        yield {**PLACES, "tmp": str(tmp), "busy": str(busy.getsockname()[1])}


def cli_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")}
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def check(c: Case, places: dict[str, str]) -> None:
    args = [arg.format(**places) for arg in shlex.split(c.line)]
    result = subprocess.run(
        [sys.executable, "-m", "gpulens.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=cli_env({k: v.format(**places) for k, v in c.env.items()}),
        cwd=places["tmp"],  # defaults such as ./gpulens-spool land there, not in the repository
        check=False,
    )
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert result.returncode == c.status, line
    prefix = "error: " if c.status == 2 else f"gpulens {args[0]}"
    assert line.startswith(prefix), line
    for needle in c.needles:
        assert needle.format(**places) in line, line
    assert SECRET not in result.stderr + result.stdout


def ids(cases: list[Case]) -> list[str]:
    return [str(c) for c in cases]


EXPORTER = [
    case("exporter --interval 0", 2, "--interval", "'0'", "positive"),
    case("exporter --interval -1", 2, "--interval", "'-1'"),
    case("exporter --interval abc", 2, "--interval", "'abc'", "30s"),
    case("exporter --speed 0", 2, "--speed", "'0'", "positive"),
    case("exporter --listen 127.0.0.1", 1, "--listen", "'127.0.0.1'", "host:port"),
    case("exporter --listen 127.0.0.1:99999", 1, "'127.0.0.1:99999'", "65535"),
    case("exporter --source sim --scenario {scenario} --listen {nohost}:9410", 1, "cannot listen", "{nohost}:9410"),
    case("exporter --source sim --scenario {tmp}/missing.toml", 1, "missing.toml", "No such file"),
    case("exporter --source sim --scenario {tmp}/invalid.toml", 1, "invalid.toml", "TOML"),
    case("exporter --source sim --scenario {tmp}/binary.toml", 1, "binary.toml", "UTF-8"),
    case(
        "exporter --source dcgm --dcgm-url 127.0.0.1:9400/metrics", 2, "--dcgm-url", "'127.0.0.1:9400/metrics'", "http"
    ),
    case("exporter --web-config {tmp}/missing.yml", 1, "missing.yml", "cannot read"),
    case("exporter --web-config {tmp}/a-directory", 1, "a-directory", "cannot read"),
    case("exporter --web-config {tmp}/binary.toml", 1, "binary.toml", "UTF-8"),
    case("exporter --web-config {tmp}/bad-web.yml", 1, "bad-web.yml:1", "nope", "expected"),
    case("exporter --source dcgm --job-map-dir {tmp}/no-such-dir", 2, "--job-map-dir", "no-such-dir", "does not exist"),
    case("exporter --source dcgm --proc-root {tmp}/a-file", 2, "--proc-root", "a-file", "not a directory"),
    case("exporter", 2, "GPULENS_EXPORTER_DCGM_URL", "'abc'", env={"GPULENS_EXPORTER_DCGM_URL": "abc"}),
    case("exporter", 2, "GPULENS_EXPORTER_SPEED", "'-2'", env={"GPULENS_EXPORTER_SPEED": "-2"}),
]


@pytest.mark.parametrize("c", EXPORTER, ids=ids(EXPORTER))
def test_exporter(c: Case, places: dict[str, str]) -> None:
    check(c, places)


_COLLECT = "collector --target http://x"
_SQLITE = "--db sqlite:///{tmp}/collector.db --spool-dir {tmp}/spool --log-level warning"
COLLECTOR = [
    case("collector --target 127.0.0.1:9410", 2, "--target", "'127.0.0.1:9410'", "http://"),
    case("collector --target http://", 2, "--target", "'http://'", "http://gpu-node-07:9410"),
    case(f"{_COLLECT} --shard 3/2", 2, "--shard", "'3/2'", "I/N"),
    case(f"{_COLLECT} --interval 0", 2, "--interval", "'0'"),
    case(f"{_COLLECT} --listen 127.0.0.1", 2, "--listen", "'127.0.0.1'", "host:port"),
    case(
        f"{_COLLECT} --db postgress://db/gpulens", 1, "--db 'postgress://db/gpulens'", "scheme 'postgress'", *ACCEPTED
    ),
    case(f"{_COLLECT} --db sqlite:///{{tmp}}/no-such-dir/x.db", 1, "--db", "no-such-dir", "does not exist"),
    # An unreachable database is not bad input for the collector: it starts and spools (see test_startup.py).
    case(f"{_COLLECT} {_SQLITE} --spool-dir {{tmp}}/a-file/spool", 1, "--spool-dir", "a-file/spool", "cannot create"),
    case(f"{_COLLECT} {_SQLITE} --listen {{nohost}}:9411", 1, "cannot listen", "{nohost}:9411"),
    case("collector --config {tmp}/missing.toml", 1, "missing.toml", "cannot read"),
    case(f"{_COLLECT} --config {{tmp}}/bad-db-url.toml", 1, "bad-db-url.toml:2", "database.url", "'postgress://"),
    case("collector", 2, "no targets", "--target"),
    case("collector", 2, "--target", "'abc'", env={"GPULENS_COLLECTOR_TARGET": "abc"}),
    case("collector", 2, "GPULENS_COLLECTOR_INTERVAL", "'soon'", env={"GPULENS_COLLECTOR_INTERVAL": "soon"}),
]


@pytest.mark.parametrize("c", COLLECTOR, ids=ids(COLLECTOR))
def test_collector(c: Case, places: dict[str, str]) -> None:
    check(c, places)


CHECK_CONFIG = [
    case("check-config {tmp}/missing.toml", 1, "missing.toml", "No such file"),
    case("check-config {tmp}/a-directory", 1, "a-directory", "directory"),
    case("check-config {tmp}/invalid.toml", 1, "invalid.toml", "invalid TOML"),
    case("check-config {tmp}/binary.toml", 1, "binary.toml", "UTF-8"),
    case("check-config {tmp}/bad-db-url.toml", 1, "bad-db-url.toml:2", "database.url", "'postgress://", *ACCEPTED),
    case("check-config {tmp}/bad-listen.toml", 1, "bad-listen.toml:2", "collector.listen", "'nowhere'"),
    case("check-config", 2, "file"),
]


@pytest.mark.parametrize("c", CHECK_CONFIG, ids=ids(CHECK_CONFIG))
def test_check_config(c: Case, places: dict[str, str]) -> None:
    check(c, places)


DB_UPGRADE = [
    case("db upgrade --db postgress://x", 1, "--db 'postgress://x'", "scheme 'postgress'", *ACCEPTED),
    case("db upgrade --db mysql://root@h/db", 1, "--db 'mysql://root@h/db'", "scheme 'mysql'", *ACCEPTED),
    case("db upgrade --db sqlite:/x.db", 1, "--db 'sqlite:/x.db'", "invalid", *ACCEPTED),
    case(f"db upgrade --db postgresql+psycopg2://u:{SECRET}@h/d", 1, "'postgresql+psycopg2://u:***@h/d'", "'psycopg2'"),
    case(f"db upgrade --db postgresql://u:{SECRET}@x@h/d", 1, "--db 'postgresql://***@h/d'", "%40"),
    case(f"db upgrade --db ::::{SECRET}@", 1, "--db", "invalid", *ACCEPTED),
    case("db upgrade --db sqlite:///{tmp}/no-such-dir/x.db", 1, "--db 'sqlite:///{tmp}/no-such-dir/x.db'", "not exist"),
    case("db upgrade --db sqlite:///{tmp}/a-directory", 1, "--db", "a-directory", "is a directory"),
    case("db upgrade --db {pg}", 1, "--db", "127.0.0.1:1", "unavailable"),
    case("db upgrade --db sqlite:///{tmp}/invalid.toml", 1, "--db", "invalid.toml", "not a usable database"),
    case("db upgrade", 1, "GPULENS_DB_URL 'mysql://x'", "scheme 'mysql'", env={"GPULENS_DB_URL": "mysql://x"}),
    case("db upgrade --config {tmp}/bad-db-url.toml", 1, "bad-db-url.toml:2: database.url 'postgress://"),
    case("db upgrade --config {tmp}/invalid.toml", 1, "invalid.toml", "invalid TOML"),
]


@pytest.mark.parametrize("c", DB_UPGRADE, ids=ids(DB_UPGRADE))
def test_db_upgrade(c: Case, places: dict[str, str]) -> None:
    check(c, places)


_SERIES = "query series --gpu GPU-1 --db sqlite:///{tmp}/not-gpulens.db"
QUERY = [
    case("query latest --db postgress://x", 1, "--db 'postgress://x'", *ACCEPTED),
    case("query latest --db sqlite:///{tmp}/none.db", 1, "--db", "none.db", "no database at"),
    case("query latest --db sqlite:///{tmp}/not-gpulens.db", 1, "not-gpulens.db", "no gpulens data"),
    case("query targets --db {pg}", 1, "--db", "127.0.0.1:1", "unavailable"),
    case("query jobs --db sqlite:///{tmp}/a-file", 1, "--db 'sqlite:///{tmp}/a-file'", "not a usable database"),
    case("query jobs --since 0", 2, "--since", "'0'"),
    case("query jobs --since abc", 2, "--since", "'abc'", "30s"),
    case(f"{_SERIES} --field nope", 2, "--field 'nope'", "utilization_ratio"),
    case(f"{_SERIES} --field up --points 0", 2, "--points", "'0'", "positive"),
    case(f"{_SERIES} --field up --points -5", 2, "--points", "'-5'", "positive"),
    case("query latest --config {tmp}/a-directory", 1, "a-directory", "cannot read"),
    case("query latest", 1, "GPULENS_DB_URL 'mysql://x'", env={"GPULENS_DB_URL": "mysql://x"}),
]


@pytest.mark.parametrize("c", QUERY, ids=ids(QUERY))
def test_query(c: Case, places: dict[str, str]) -> None:
    check(c, places)


_DEMO = "demo --workdir {tmp}/demo"
DEMO = [
    case(f"{_DEMO} --speed 0", 2, "--speed", "'0'"),
    case(f"{_DEMO} --port 99999", 2, "--port", "'99999'", "65535"),
    case(f"{_DEMO} --port abc", 2, "--port", "'abc'"),
    case(f"{_DEMO} --webhook-url hooks.example", 2, "--webhook-url", "'hooks.example'", "http://"),
    case(f"{_DEMO} --scenario {{tmp}}/missing.toml", 1, "missing.toml", "No such file"),
    case(f"{_DEMO} --scenario {{tmp}}/binary.toml", 1, "binary.toml", "UTF-8"),
    case(f"{_DEMO} --db postgress://x", 1, "--db 'postgress://x'", *ACCEPTED),
    case(f"{_DEMO} --db {{pg}}", 1, "--db", "127.0.0.1:1", "unavailable"),
    case("demo --workdir {tmp}/a-file/demo", 1, "--workdir", "a-file/demo", "cannot create"),
    case(_DEMO, 2, "GPULENS_DEMO_PORT", "'x'", "65535", env={"GPULENS_DEMO_PORT": "x"}),
]


@pytest.mark.parametrize("c", DEMO, ids=ids(DEMO))
def test_demo(c: Case, places: dict[str, str]) -> None:
    check(c, places)


SIMULATE = [
    case("simulate {tmp}/missing.toml", 1, "missing.toml", "No such file"),
    case("simulate {tmp}/a-directory", 1, "a-directory", "directory"),
    case("simulate {tmp}/invalid.toml", 1, "invalid.toml", "TOML"),
    case("simulate {scenario} --db postgress://x", 1, "--db 'postgress://x'", *ACCEPTED),
    case("simulate {scenario} --db sqlite:///{tmp}/no-such-dir/sim.db", 1, "--db", "no-such-dir", "does not exist"),
    case("simulate {scenario} --db {pg}", 1, "--db", "127.0.0.1:1", "unavailable"),
    case("simulate {scenario} --rules {tmp}/missing.toml", 1, "missing.toml", "cannot read"),
    case("simulate {scenario} --rules {tmp}/binary.toml", 1, "binary.toml", "UTF-8"),
    case("simulate {scenario} --rules {tmp}/bad-rules.toml", 1, "bad-rules.toml:1", "rules[0]"),
    case("simulate {scenario}", 1, "'mysql://x'", "scheme 'mysql'", env={"GPULENS_SIMULATE_DB": "mysql://x"}),
]


@pytest.mark.parametrize("c", SIMULATE, ids=ids(SIMULATE))
def test_simulate(c: Case, places: dict[str, str]) -> None:
    check(c, places)


RULES = [
    case("rules export --format grafana", 2, "--format", "'grafana'", "prometheus"),
    case("rules export --config {tmp}/missing.toml", 1, "missing.toml", "cannot read"),
    case("rules export --config {tmp}/invalid.toml", 1, "invalid.toml", "invalid TOML"),
    case("rules export --config {tmp}/unknown-rule.toml", 1, "alerts.builtin.Nope", "GpuLost"),
    case("rules", 2, "ACTION"),
]


@pytest.mark.parametrize("c", RULES, ids=ids(RULES))
def test_rules_export(c: Case, places: dict[str, str]) -> None:
    check(c, places)


_ADD = "silence add --comment repairs --db sqlite:///{tmp}/silence.db --duration 1h"
SILENCE = [
    case(f"{_ADD} --match node", 2, "--match 'node'", "name=value"),
    case(f"{_ADD} --match =x", 2, "--match '=x'", "label name"),
    case(f"{_ADD} --match 'node=~['", 2, "--match 'node=~['", "regular expression"),
    case(f"{_ADD} --match node=a --duration 0", 2, "--duration", "'0'"),
    case("silence add --comment x --duration 1h --match node=a --db postgress://x", 1, "--db 'postgress://x'"),
    case("silence list --db {pg}", 1, "--db", "127.0.0.1:1", "unavailable"),
    case("silence list --db sqlite:///{tmp}/no-such-dir/s.db", 1, "--db", "no-such-dir", "does not exist"),
    case("silence expire abc", 2, "'abc'", "silence id"),
    case("silence expire 1.5", 2, "'1.5'", "silence id"),
    case("silence expire 7 --db sqlite:///{tmp}/silence.db", 1, "no active silence 7"),
]


@pytest.mark.parametrize("c", SILENCE, ids=ids(SILENCE))
def test_silence(c: Case, places: dict[str, str]) -> None:
    check(c, places)


ALERTS_LIST = [
    case("alerts list --db {pg}", 1, "--db", "127.0.0.1:1", "unavailable"),
    case("alerts list --db sqlite:///{tmp}/none.db --json", 1, "--db", "none.db", "no database"),
    case("alerts list --db prometheus+http://127.0.0.1:1 --state-db sqlite:///{tmp}/no/s.db", 1, "--state-db", "no"),
]


@pytest.mark.parametrize("c", ALERTS_LIST, ids=ids(ALERTS_LIST))
def test_alerts_list(c: Case, places: dict[str, str]) -> None:
    check(c, places)


ALERTS = [
    case("alerts test-notify ops", 2, "--config"),
    case("alerts test-notify ops --config {tmp}/missing.toml", 1, "missing.toml", "cannot read"),
    case("alerts test-notify ops --config {tmp}/invalid.toml", 1, "invalid.toml", "TOML"),
    case("alerts test-notify ops --config {tmp}/bad-kind.toml", 1, "bad-kind.toml:3", "'pager'", "webhook"),
    case("alerts test-notify nope --config {tmp}/log-receiver.toml", 1, "'nope'", "the config has: ops"),
    case("alerts test-notify ops --config x --log-level loud", 2, "--log-level", "'loud'"),
]


@pytest.mark.parametrize("c", ALERTS, ids=ids(ALERTS))
def test_alerts_test_notify(c: Case, places: dict[str, str]) -> None:
    check(c, places)


_DASH = "dashboard --db sqlite:///{tmp}/dashboard.db"
DASHBOARD = [
    case("dashboard --listen 127.0.0.1", 2, "--listen", "'127.0.0.1'", "host:port"),
    case("dashboard --listen 127.0.0.1:99999", 2, "'127.0.0.1:99999'", "65535"),
    case(f"{_DASH} --listen {{nohost}}:8050", 1, "--listen '{nohost}:8050'", "cannot listen"),
    case(f"{_DASH} --listen 127.0.0.1:{{busy}}", 1, "--listen '127.0.0.1:{busy}'", "in use"),
    case("dashboard --db postgress://x", 1, "--db 'postgress://x'", *ACCEPTED),
    case("dashboard --db sqlite:///{tmp}/no-such-dir/d.db", 1, "--db", "does not exist"),
    case(f"{_DASH} --listen 127.0.0.1:0 --basic-auth-file {{tmp}}/missing", 1, "missing", "cannot read"),
    case(f"{_DASH} --listen 127.0.0.1:0 --basic-auth-file {{tmp}}/htpasswd", 1, "htpasswd:1", "user:bcrypt-hash"),
    case("dashboard --config {tmp}/missing.toml", 1, "missing.toml", "cannot read"),
    case("dashboard", 2, "--listen", "'x'", env={"GPULENS_DASHBOARD_LISTEN": "x"}),
]


@pytest.mark.parametrize("c", DASHBOARD, ids=ids(DASHBOARD))
def test_dashboard(c: Case, places: dict[str, str]) -> None:
    check(c, places)


# --- the last resort ------------------------------------------------------------------------------------------------

_BROKEN = """\
import importlib, sys
cli_main = importlib.import_module("gpulens.cli.main")
cmd_rules = importlib.import_module("gpulens.cli.cmd_rules")
def broken(args):
    raise {exc}
cmd_rules._run_rules_export = broken
sys.exit(cli_main.main(sys.argv[1:]))
"""


def run_broken(exc: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``gpulens rules export <args>`` with the command replaced by one that raises ``exc``."""
    return subprocess.run(
        [sys.executable, "-c", _BROKEN.format(exc=exc), "rules", "export", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=cli_env({}),
        check=False,
    )


def test_an_unexpected_exception_is_one_line_with_exit_70() -> None:
    result = run_broken("RuntimeError('the first line\\nthe second line')")
    assert result.returncode == 70, result.stderr
    assert result.stderr.strip().splitlines() == [
        "gpulens rules export: internal error: RuntimeError: the first line "
        "(run with --log-level debug for the traceback)"
    ]


def test_log_level_debug_shows_the_traceback_of_an_unexpected_exception() -> None:
    result = run_broken("RuntimeError('boom')", "--log-level", "debug")
    assert result.returncode == 70
    assert "Traceback" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("gpulens rules export: internal error: RuntimeError: boom")


def test_an_interrupt_exits_130_quietly() -> None:
    result = run_broken("KeyboardInterrupt()")
    assert result.returncode == 130
    assert result.stderr == ""
