"""``gpulens demo``: the whole stack on a simulated cluster."""

from __future__ import annotations

import argparse
from typing import Any

from gpulens.cli.base import DEMO_WORKDIR, CliError, Formatter, database_errors, http_url, port_number, positive_float
from gpulens.cli.envtwins import apply_env_twins
from gpulens.cli.lifecycle import stop_on_signals

DEMO_EXAMPLES = """\
examples:
  gpulens demo                                       # 4 nodes x 8 H100, dashboard at http://127.0.0.1:8050
  gpulens demo --speed 10                            # faults arrive 10x sooner
  gpulens demo --scenario examples/scenarios/faults.toml --port 8080
  GPULENS_SLACK_WEBHOOK_URL=https://hooks.slack.com/services/... gpulens demo   # alerts to Slack
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="run the whole stack on a simulated cluster",
        description="Starts simulated exporters (one process per node), the collector with the alert engine "
        "writing to SQLite, and the dashboard; prints the URLs; Ctrl-C stops everything.",
        epilog=DEMO_EXAMPLES,
        formatter_class=Formatter,
    )
    p.add_argument("--scenario", default=None, help="scenario TOML (default: the bundled demo scenario)")
    p.add_argument("--speed", type=positive_float, default=2.0, help="virtual time runs this many times faster")
    p.add_argument("--db", default=None, help="database URL (default: SQLite in the work directory)")
    p.add_argument("--port", type=port_number, default=8050, help="dashboard port")
    p.add_argument("--workdir", default=DEMO_WORKDIR, help="where the database, config and logs go")
    p.add_argument(
        "--webhook-url",
        type=http_url("http://127.0.0.1:8080/hook"),
        default=None,
        help="also send alerts to this generic webhook",
    )
    p.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], default="warning", help="logging verbosity"
    )
    apply_env_twins(p, "GPULENS_DEMO_")
    p.set_defaults(func=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gpulens.cli.demo_stack import DemoOptions, run_demo

    if args.db:
        from gpulens.storage.connect import open_database

        with database_errors("--db"):  # a bad URL or a database down stops the demo before any process starts
            open_database(args.db).close()
    options = DemoOptions(
        scenario=Path(args.scenario) if args.scenario else None,
        speed=args.speed,
        db_url=args.db,
        port=args.port,
        workdir=Path(args.workdir),
        webhook_url=args.webhook_url,
    )
    try:
        with stop_on_signals() as stop:
            return run_demo(options, lambda line: print(line, flush=True), stop)
    except RuntimeError as exc:
        raise CliError(str(exc).splitlines()[0] + f" (logs in {args.workdir}/)") from None
