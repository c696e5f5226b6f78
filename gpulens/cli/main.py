"""The ``gpulens`` command line: every command's parser, and the one place that prints errors and picks exit codes."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

import gpulens
from gpulens.cli import (
    cmd_alerts,
    cmd_check_config,
    cmd_collector,
    cmd_dashboard,
    cmd_db,
    cmd_demo,
    cmd_exporter,
    cmd_incidents,
    cmd_job_summary,
    cmd_node_health,
    cmd_query,
    cmd_remediation,
    cmd_report,
    cmd_rules,
    cmd_silence,
    cmd_simulate,
)
from gpulens.cli.base import CliError, Parser, UsageError
from gpulens.config import ConfigError
from gpulens.extras import MissingExtraError
from gpulens.model import SourceError

MAIN_EXAMPLES = """\
examples:
  gpulens exporter                       # run the node agent on a GPU node
  gpulens exporter --source sim --scenario examples/scenarios/healthy.toml --all-nodes
  gpulens collector --target http://127.0.0.1:9410 --interval 5s
  gpulens query latest
  gpulens <command> --help               # every flag, with its GPULENS_<COMMAND>_* twin
"""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="gpulens",
        description="gpulens: monitoring and observability for NVIDIA GPU clusters.",
        epilog=MAIN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpulens {gpulens.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    cmd_exporter.register(sub)
    cmd_collector.register(sub)
    cmd_check_config.register(sub)
    cmd_db.register(sub)
    cmd_query.register(sub)
    cmd_job_summary.register(sub)
    cmd_report.register(sub)
    cmd_node_health.register(sub)
    cmd_demo.register(sub)
    cmd_simulate.register(sub)
    cmd_rules.register(sub)
    cmd_silence.register(sub)
    cmd_alerts.register(sub)
    cmd_remediation.register(sub)
    cmd_incidents.register(sub)
    cmd_dashboard.register(sub)
    return parser


_ACTIONS = ("db_command", "what", "rules_command", "silence_command", "alerts_command", "remediation_command")

log = logging.getLogger("gpulens.cli")


def command_name(args: argparse.Namespace) -> str:
    """``gpulens query latest``: the command and its action, as error messages name them."""
    action = next((getattr(args, a) for a in _ACTIONS if getattr(args, a, None)), None)
    return " ".join(["gpulens", args.command, *([action] if action else [])])


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=getattr(logging, str(getattr(args, "log_level", "warning")).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("apscheduler", "alembic"):  # a line per scheduled run / migration step is not news
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    command = command_name(args)
    try:
        result: int = args.func(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (CliError, ConfigError, SourceError, MissingExtraError) as exc:
        print(f"{command}: error: {_one_line(str(exc))}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{command}: error: {_os_error_text(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the last resort: a bug, or an error no layer has named yet; never a traceback
        line = database_error_line(exc)
        if line is not None:
            print(f"{command}: error: {line}", file=sys.stderr)
            return 1
        log.debug("%s failed", command, exc_info=True)
        print(
            f"{command}: internal error: {type(exc).__name__}: {_one_line(str(exc))} "
            "(run with --log-level debug for the traceback)",
            file=sys.stderr,
        )
        return 70
    return result


def database_error_line(exc: BaseException) -> str | None:
    """A database error as one line without a password, or None if ``exc`` is not one.

    ``storage.db`` and the Prometheus client word the connection failures (unreachable, wrong password, no such
    database); any other SQLAlchemy or Alembic error is named by its driver's first line. Only modules already
    imported are looked at, so a command that never touched the database pays nothing for this.
    """
    reading = sys.modules.get("gpulens.storage.reading")  # its DatabaseUnavailableError: SQL and Prometheus stores
    if reading is not None and isinstance(exc, reading.DatabaseUnavailableError):
        return str(exc)
    db_module = sys.modules.get("gpulens.storage.db")
    sa_exc = sys.modules.get("sqlalchemy.exc")
    alembic_exc = sys.modules.get("alembic.util.exc")
    known = tuple(
        cls
        for cls in (
            getattr(sa_exc, "SQLAlchemyError", None),
            getattr(alembic_exc, "CommandError", None),
        )
        if isinstance(cls, type)
    )
    if not known or not isinstance(exc, known):
        return None
    cause = getattr(exc, "orig", None) or exc
    lines = str(cause).strip().splitlines()
    detail = " ".join(lines[0].split()) if lines else ""
    text = f"database error: {type(cause).__name__}" + (f": {detail}" if detail else "")
    if db_module is not None:
        text = db_module.redact_url(text) if "://" in text else text
    return text


def _one_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else ""


def _os_error_text(exc: OSError) -> str:
    """``PATH: reason`` when the error names a file (mkdir, open), else the reason."""
    reason = exc.strerror or str(exc)
    if exc.filename is not None:
        return f"{exc.filename}: {reason}"
    return reason
