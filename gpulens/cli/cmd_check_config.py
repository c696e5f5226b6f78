"""``gpulens check-config``: validate a gpulens.toml."""

from __future__ import annotations

import argparse
from typing import Any

from gpulens.cli.base import Formatter, add_log_level, database_errors, database_origin


def register(sub: Any) -> None:
    p = sub.add_parser(
        "check-config",
        help="validate a gpulens.toml",
        description="Validates a config file; every error names the file, the key and the line.",
        epilog="example:\n  gpulens check-config /etc/gpulens/gpulens.toml\n",
        formatter_class=Formatter,
    )
    p.add_argument("file", help="the config file")
    add_log_level(p)
    p.set_defaults(func=_run_check_config)


def _run_check_config(args: argparse.Namespace) -> int:
    from gpulens.alerts.service import alerting_config
    from gpulens.settings import load_settings
    from gpulens.storage.db import Database

    settings = load_settings(args.file)
    alerting = alerting_config(settings)
    # The scheme and driver only: a relative SQLite path is the service's, not this shell's, and nothing connects.
    with database_errors(database_origin(argparse.Namespace(config=args.file), settings)):
        Database(settings.db_url).close()
    from gpulens.httpfetch import redact_url

    print(
        f"{args.file}: OK ({len(settings.targets)} targets, {len(settings.file_sd)} file_sd, "
        f"{len(alerting.rules)} alert rules, {len(alerting.causes)} causal rows, "
        f"{len(alerting.inhibitions)} inhibitions, {len(alerting.receivers)} receivers, "
        f"database {redact_url(settings.db_url)})"
    )
    return 0
