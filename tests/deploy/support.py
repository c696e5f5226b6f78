"""Shared helpers for the deployment tests: the repository's files, the CLI's real flags, and docker-compose."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpulens.cli import build_parser
from tests.conftest import require_tool

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
TOML = DEPLOY / "config" / "gpulens.toml"
PROMETHEUS_DIR = DEPLOY / "prometheus"
GRAFANA_JSON = DEPLOY / "grafana" / "gpulens-dashboard.json"
METRICS_MD = ROOT / "docs" / "metrics.md"
PROFILES = ("gpu", "sim", "dcgm", "prom-read")

# Environment variables the compose file interpolates: the tests resolve it with none of them set, unless a test
# sets one on purpose.
_INTERPOLATED = re.compile(r"^(GPULENS_|DCGM_|POSTGRES_|PROMETHEUS_|COMPOSE_)")


def subcommand(name: str) -> argparse.ArgumentParser:
    """The real parser of ``gpulens <name>`` (fails the test when the CLI has no such command)."""
    parser = build_parser()
    for action in parser._actions:  # argparse offers no public way to reach subparsers
        if isinstance(action, argparse._SubParsersAction):
            sub: argparse.ArgumentParser | None = action.choices.get(name)
            if sub is None:
                pytest.fail(f"`gpulens {name}` does not exist; commands: {', '.join(action.choices)}")
            return sub
    raise AssertionError("gpulens has no subcommands")


def flags(command: str) -> dict[str, argparse.Action]:
    """``{dest: action}`` for every flag of ``gpulens <command>``."""
    return {a.dest: a for a in subcommand(command)._actions if a.option_strings and a.dest != "help"}


def env_twin(command: str, dest: str) -> str:
    return f"GPULENS_{command.upper()}_{dest.upper()}"


def default_port(command: str) -> int:
    """The port of ``gpulens <command> --listen``'s default."""
    return port_of(str(flags(command)["listen"].default))


def port_of(listen: str) -> int:
    return int(listen.rpartition(":")[2])


def parse_with_env(argv: list[str], environ: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    """Parse ``gpulens argv`` as the CLI would with ``environ`` set: the environment twins become the defaults."""
    for name in [n for n in os.environ if n.startswith("GPULENS_")]:
        monkeypatch.delenv(name)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    return build_parser().parse_args(argv)


def unknown_twins(command: str, environ: dict[str, str]) -> set[str]:
    """``GPULENS_<COMMAND>_*`` names in ``environ`` that name no flag: the CLI would silently ignore them."""
    prefix = f"GPULENS_{command.upper()}_"
    known = {env_twin(command, dest) for dest in flags(command)}
    return {name for name in environ if name.startswith(prefix) and name not in known}


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not _INTERPOLATED.match(k)}
    env.update(extra)
    return env


def docker_compose(
    *args: str, env: dict[str, str] | None = None, compose_file: Path = COMPOSE_FILE
) -> subprocess.CompletedProcess[str]:
    """Run Debian's docker-compose on a compose file; no Docker engine is needed for ``config``."""
    binary = require_tool("docker-compose")
    return subprocess.run(
        [binary, "--project-directory", str(ROOT), "-f", str(compose_file), *args],
        capture_output=True,
        text=True,
        env=env if env is not None else clean_env(),
        timeout=120,
        check=False,
    )


def resolved_compose(*profiles: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The compose file as docker-compose resolves it (anchors merged, variables interpolated, paths absolute)."""
    args = [arg for profile in profiles for arg in ("--profile", profile)]
    result = docker_compose(*args, "config", env=env)
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = yaml.safe_load(result.stdout)
    return config


def service_env(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment with every value a string; variables passed through from the host are left out."""
    environment = service.get("environment") or {}
    return {name: str(value) for name, value in environment.items() if value is not None}


def gpulens_command() -> list[str]:
    """How the tests start the real CLI."""
    return [sys.executable, "-m", "gpulens.cli"]


def dockerfile_instructions() -> list[tuple[str, str]]:
    """The Dockerfile's ``(INSTRUCTION, arguments)`` pairs, continuation lines joined."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    pairs = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            instruction, _, rest = line.strip().partition(" ")
            pairs.append((instruction, " ".join(rest.split())))
    return pairs


def image_path_in_repo(path: str) -> Path:
    """The repository file that the Dockerfile copies to ``path`` in the image."""
    for instruction, rest in dockerfile_instructions():
        if instruction == "COPY" and not rest.startswith("--from"):
            source, target = rest.split()
            if path.startswith(target.rstrip("/") + "/"):
                return ROOT / source / path[len(target.rstrip("/")) + 1 :]
    raise AssertionError(f"the Dockerfile copies nothing to {path}")
