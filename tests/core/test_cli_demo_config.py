"""After ``make demo``, the README's CLI commands run from the same directory find the demo's config by themselves
(and say so in one line on stderr); anywhere else they keep the default database and its error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpulens.cli.base import DEMO_CONFIG, DEMO_WORKDIR
from tests.dbtemplate import migrated_sqlite


def gpulens(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GPULENS_DB_URL"}
    return subprocess.run(
        [sys.executable, "-m", "gpulens.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def after_demo(tmp_path: Path) -> Path:
    """A directory where a demo ran: its work directory holds a store and the config naming it."""
    work = tmp_path / DEMO_WORKDIR
    work.mkdir()
    url = migrated_sqlite(work / "gpulens.db")
    (tmp_path / DEMO_CONFIG).write_text(f'[database]\nurl = "{url}"\n', encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize("command", [("query", "latest"), ("alerts", "list")])
def test_the_cli_finds_the_demo_config_where_the_demo_ran(after_demo: Path, command: tuple[str, ...]) -> None:
    done = gpulens(after_demo, *command)
    assert done.returncode == 0, done.stderr
    assert f"--config {DEMO_CONFIG}" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_elsewhere_the_default_database_is_still_asked_for(tmp_path: Path) -> None:
    done = gpulens(tmp_path, "query", "latest")
    assert done.returncode == 1
    assert "no database at gpulens.db" in done.stderr
    assert DEMO_CONFIG not in done.stderr


def test_an_explicit_db_is_never_replaced_by_the_demo_config(after_demo: Path) -> None:
    done = gpulens(after_demo, "query", "latest", "--db", f"sqlite:///{after_demo / 'none.db'}")
    assert done.returncode == 1
    assert "none.db" in done.stderr
    assert DEMO_CONFIG not in done.stderr


def test_a_command_that_writes_or_serves_never_switches_to_the_demo(
    after_demo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The collector, the dashboard and ``db upgrade`` keep the default database; only the read commands look."""
    import argparse

    from gpulens.cli.base import settings_from

    monkeypatch.chdir(after_demo)
    monkeypatch.delenv("GPULENS_DB_URL", raising=False)
    args = argparse.Namespace(config=None, db=None)
    assert str(settings_from(args).db_url) == "sqlite:///gpulens.db"
    assert args.config is None
    assert "gpulens-demo" in str(settings_from(args, reads_demo=True).db_url)
