"""Starting in any weather: a collector process started while PostgreSQL is down runs, spools, migrates and stores
every round once the database is back, and stops cleanly on SIGTERM; a wrong password or a missing database is
fatal at once, and every command that touches the database reports its errors in one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from gpulens.cli.main import main
from gpulens.storage import schema
from gpulens.storage.db import Database
from tests.collector.live import GPUS, live_exporter
from tests.conftest import free_port, http_get
from tests.storage.conftest import SECRET_PASSWORD, SECRET_ROLE, PgServer

ROOT = Path(__file__).resolve().parents[2]


def wait_until(condition: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def collector_metrics(port: int) -> dict[str, float]:
    try:
        status, _, body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=2)
    except OSError:
        return {}
    if status != 200:
        return {}
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if not sample.labels:
                out[sample.name] = sample.value
    return out


def stored_rounds(url: str) -> int:
    db = Database(url)
    try:
        with db.session() as s:
            rows = s.execute(sa.select(sa.func.count()).select_from(schema.gpu_sample)).scalar_one()
    finally:
        db.close()
    return int(rows) // GPUS


def test_a_collector_started_while_postgres_is_down_spools_then_stores_every_round(
    private_pg_server: PgServer, tmp_path: Path
) -> None:
    url = private_pg_server.url(private_pg_server.create_database())
    private_pg_server.stop()
    port = free_port()
    spool = tmp_path / "spool"
    with live_exporter() as exporter:
        command = ["collector", "--db", url, "--target", exporter, "--interval", "1s"]
        command += ["--listen", f"127.0.0.1:{port}", "--spool-dir", str(spool)]
        process = subprocess.Popen(
            [sys.executable, "-m", "gpulens.cli", *command],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            # It runs and spools while the database is down...
            wait_until(lambda: collector_metrics(port).get("gpulens_collector_spool_rounds", 0) >= 3, 60, "spooling")
            assert process.poll() is None
            assert collector_metrics(port)["gpulens_collector_database_up"] == 0
            private_pg_server.start()
            # ... migrates and replays once it is back, then writes every round.
            wait_until(
                lambda: (
                    (m := collector_metrics(port)).get("gpulens_collector_database_up") == 1
                    and m.get("gpulens_collector_spool_rounds") == 0
                ),
                60,
                "the spool to drain",
            )
            wait_until(lambda: stored_rounds(url) >= 3, 30, "rounds stored")
            time.sleep(2)
            rounds_run = collector_metrics(port)["gpulens_collector_round_duration_seconds_count"]
            process.send_signal(signal.SIGTERM)
            _, stderr = process.communicate(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert "spooling" in stderr
    stored = stored_rounds(url)
    assert rounds_run <= stored <= rounds_run + 1  # every round, spooled or not, stored once
    assert not list(spool.glob("*.json.gz"))


def one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_a_wrong_password_or_a_missing_database_is_fatal_in_one_line(
    pg_server: PgServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    name = pg_server.create_database()
    wrong = pg_server.url(name, user=SECRET_ROLE, password=SECRET_PASSWORD[::-1])
    missing = pg_server.url("no_such_database")
    target = ["--target", "http://127.0.0.1:9", "--spool-dir", str(tmp_path / "spool")]
    for argv in (
        ["collector", "--db", wrong, *target],
        ["collector", "--db", missing, *target],
        ["db", "upgrade", "--db", wrong],
        ["query", "latest", "--db", missing],
        ["dashboard", "--db", wrong, "--listen", "127.0.0.1:0"],
    ):
        line = one_line_error(argv, capsys)
        assert line.startswith(f"gpulens {argv[0]}")
        assert ": error: " in line
        assert "database" in line
        assert "refused access" in line
        assert SECRET_PASSWORD[::-1] not in line
    pg_server.drop_database(name)


def test_database_commands_report_an_unreachable_database_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    down = f"postgresql+psycopg://{SECRET_ROLE}:{SECRET_PASSWORD}@127.0.0.1:{free_port()}/gpulens"
    for argv in (["db", "upgrade", "--db", down], ["query", "latest", "--db", down], ["query", "jobs", "--db", down]):
        line = one_line_error(argv, capsys)
        assert "unavailable" in line
        assert SECRET_PASSWORD not in line


def test_the_open_file_limit_is_raised_to_the_hard_limit_and_a_short_one_is_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One connection per target stays open between rounds: a 1,000-target collector under a soft limit of 1,024
    would fail connects. The soft limit is raised to the hard one, and a hard limit too low for the targets is
    logged."""
    import resource

    from gpulens.collector.runner import _MOST_FILES, FILES_BESIDES_TARGETS, raise_open_files_limit

    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    hard = before[1]
    raised = _MOST_FILES if hard == resource.RLIM_INFINITY else hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, raised), hard))
        with caplog.at_level("WARNING", logger="gpulens.collector.runner"):
            assert raise_open_files_limit(10) == (raised, hard)
            assert resource.getrlimit(resource.RLIMIT_NOFILE) == (raised, hard)
            assert not caplog.records
            raise_open_files_limit(raised)  # more targets than the limit allows
        [warning] = caplog.records
        assert f"below the {raised + FILES_BESIDES_TARGETS} descriptors {raised} targets need" in warning.getMessage()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)
