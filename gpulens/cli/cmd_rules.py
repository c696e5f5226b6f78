"""``gpulens rules export``: the built-in rules in another system's format."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gpulens.cli.base import Formatter, Parser, add_log_level


def register(sub: Any) -> None:
    p = sub.add_parser(
        "rules",
        help="the built-in alert rules",
        description="The built-in alert rules, as the collector evaluates them or as a Prometheus rules file.",
        epilog="examples:\n  gpulens rules export --format prometheus > gpulens-rules.yml\n"
        "  gpulens rules export --format prometheus --config gpulens.toml   # with your threshold overrides\n",
        formatter_class=Formatter,
    )
    rsub = p.add_subparsers(dest="rules_command", metavar="ACTION", parser_class=Parser)
    rsub.required = True
    export = rsub.add_parser("export", help="print the rules in another system's format")
    export.add_argument("--format", choices=["prometheus"], default="prometheus", help="output format")
    export.add_argument("--config", default=None, help="gpulens.toml whose [alerts] overrides apply")
    add_log_level(export)
    export.set_defaults(func=_run_rules_export)


def _run_rules_export(args: argparse.Namespace) -> int:
    from gpulens.alerts.promexport import prometheus_rules_yaml
    from gpulens.alerts.service import alerting_config
    from gpulens.settings import default_settings, load_settings

    settings = load_settings(args.config) if args.config else default_settings()
    sys.stdout.write(prometheus_rules_yaml(alerting_config(settings).rules))
    return 0
