"""``gpulens dashboard``: serving the web UI."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gpulens.cli.base import Formatter, UsageError, add_db_flags, settings_from
from gpulens.cli.envtwins import apply_env_twins
from gpulens.cli.lifecycle import stop_on_signals
from gpulens.netaddr import parse_listen

DASHBOARD_EXAMPLES = """\
examples:
  gpulens dashboard --config gpulens.toml                 # http://127.0.0.1:8050
  gpulens dashboard --db sqlite:///gpulens.db --listen 0.0.0.0:8050 --basic-auth-file /etc/gpulens/htpasswd
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "dashboard",
        help="serve the web UI over the stored history",
        description="The web UI: cluster overview, nodes and GPUs, jobs, interconnect and alerts. It reads the store "
        "the collector writes; bound to 127.0.0.1 unless told otherwise.",
        epilog=DASHBOARD_EXAMPLES,
        formatter_class=Formatter,
    )
    add_db_flags(p)
    p.add_argument("--listen", default="127.0.0.1:8050", help="where to serve, host:port")
    p.add_argument("--basic-auth-file", default=None, help="htpasswd-style file of user:bcrypt-hash lines")
    p.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], default="info", help="logging verbosity"
    )
    apply_env_twins(p, "GPULENS_DASHBOARD_")
    p.set_defaults(func=_run_dashboard)


def _run_dashboard(args: argparse.Namespace) -> int:
    from alerts.service import SqlAlertReader
    from dashboard.server import run_dashboard

    try:
        host, port = parse_listen(args.listen)
    except ValueError as exc:
        raise UsageError(f"--listen: {exc}") from None
    with stop_on_signals() as stop:
        return run_dashboard(
            settings_from(args),
            host=host,
            port=port,
            basic_auth_file=args.basic_auth_file,
            alerts=SqlAlertReader,
            announce=lambda line: print(line, file=sys.stderr, flush=True),
            stop=stop,
        )
