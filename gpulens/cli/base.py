"""What every command shares: the errors the CLI turns into exit codes, parser classes, flag types, --config/--db."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, NoReturn

from gpulens.config import parse_duration


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 1."""


class UsageError(Exception):
    """A bad flag or flag value: printed as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


class Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    pass


def positive_duration(text: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return seconds


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def add_db_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="gpulens.toml (docs/configuration.md)")
    p.add_argument("--db", default=None, help="database URL (overrides the config; GPULENS_DB_URL also works)")


def settings_from(args: argparse.Namespace) -> Any:
    """The settings a command runs with: --config (or the defaults), then --db."""
    from gpulens.settings import default_settings, load_settings

    settings = load_settings(args.config) if args.config else default_settings()
    if getattr(args, "db", None):
        settings = dataclasses.replace(settings, db_url=args.db)
    return settings
