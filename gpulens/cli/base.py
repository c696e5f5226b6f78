"""What every command shares: the errors the CLI turns into exit codes, parser classes, flag types, --config/--db."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final, NoReturn

from gpulens.config import TomlLocator, parse_duration
from gpulens.httpfetch import check_url, redact_url


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


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {text!r}")
    return value


def port_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number from 1 to 65535, got {text!r}")
    return value


def http_url(example: str) -> Callable[[str], str]:
    """A flag type: an http(s) URL with a host, like ``example``."""

    def convert(text: str) -> str:
        try:
            check_url(text, example)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected an http:// or https:// URL like {example}, got {redact_url(text)!r}"
            ) from None
        return text

    return convert


def existing_directory(flag: str, path: str, what: str) -> Path:
    """``path`` as a directory that exists, or a ``UsageError`` naming ``flag`` and the value."""
    directory = Path(path)
    if not directory.is_dir():
        state = "is not a directory" if directory.exists() else "does not exist"
        raise UsageError(f"{flag} {path!r}: {state} (expected {what})")
    return directory


def add_log_level(p: argparse.ArgumentParser, default: str = "warning") -> None:
    p.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], default=default, help="logging verbosity"
    )


def add_db_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="gpulens.toml (docs/configuration.md)")
    p.add_argument("--db", default=None, help="database URL (overrides the config; GPULENS_DB_URL also works)")


# Where ``gpulens demo`` writes its database, config and logs by default (relative to where it runs).
DEMO_WORKDIR: Final = ".gpulens-demo"
DEMO_CONFIG: Final = f"{DEMO_WORKDIR}/gpulens.toml"


def demo_config(args: argparse.Namespace, default_db_url: str) -> str | None:
    """The demo's config, for a command given neither --config, --db nor GPULENS_DB_URL, run where a demo ran and
    where the default database does not exist: what ``gpulens query latest`` after ``make demo`` means."""
    if getattr(args, "config", None) or getattr(args, "db", None) or os.environ.get("GPULENS_DB_URL"):
        return None
    default_file = default_db_url.removeprefix("sqlite:///")
    if default_file == default_db_url or Path(default_file).exists() or not Path(DEMO_CONFIG).is_file():
        return None
    return DEMO_CONFIG


def settings_from(args: argparse.Namespace, *, reads_demo: bool = False) -> Any:
    """The settings a command runs with: --config (or the defaults), then --db. A command that only reads a store
    (``reads_demo``: ``query``, ``alerts list``, ``job-summary``) takes the demo's config where ``demo_config`` finds
    it, said on stderr in one line; a command that writes or serves never switches by itself."""
    from gpulens.settings import default_settings, load_settings

    settings = load_settings(args.config) if args.config else default_settings()
    found = demo_config(args, str(settings.db_url)) if reads_demo else None
    if found is not None:
        print(
            f"note: no database at the default {settings.db_url}; reading the demo's: --config {found}", file=sys.stderr
        )
        args.config = found
        settings = load_settings(found)
    if getattr(args, "db", None):
        settings = dataclasses.replace(settings, db_url=args.db)
    return settings


def database_origin(args: argparse.Namespace, settings: Any = None) -> str | None:
    """Where the database URL a command uses came from, as error messages name it; None for the built-in default."""
    if getattr(args, "db", None):
        return "--db"
    if os.environ.get("GPULENS_DB_URL"):
        return "GPULENS_DB_URL"
    config = getattr(args, "config", None)
    if not config:
        return None
    from_file = settings is not None and settings.raw.get("database", {}).get("url_file")
    key = "database.url_file" if from_file else "database.url"
    line = TomlLocator(settings.text).line_of("database", None, key.partition(".")[2]) if settings else None
    return f"{config}:{line}: {key}" if line else f"{config}: {key}"


@contextmanager
def database_errors(origin: str | None) -> Iterator[None]:
    """Turn the store's errors about its URL or its reachability into one-line ``CliError`` naming the URL's origin.

    The store's messages already hide any password.
    """
    from gpulens.storage.db import DatabaseUnavailableError, DatabaseURLError

    try:
        yield
    except DatabaseURLError as exc:
        raise CliError(f"{origin or 'database URL'} {exc.url!r}: {exc.reason}") from None
    except DatabaseUnavailableError as exc:
        raise CliError(f"{origin}: {exc}" if origin else str(exc)) from None


def checked_db_url(args: argparse.Namespace, settings: Any) -> str:
    """The settings' database URL, checked (scheme, driver, SQLite directory) without connecting."""
    from gpulens.storage.connect import check_database_url

    with database_errors(database_origin(args, settings)):
        check_database_url(settings.db_url)
    return str(settings.db_url)
