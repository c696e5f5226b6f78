"""``gpulens dashboard``: serving the web UI."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gpulens.cli.base import CliError, Formatter, UsageError, add_db_flags, checked_db_url, settings_from
from gpulens.cli.envtwins import apply_env_twins
from gpulens.cli.lifecycle import stop_on_signals
from gpulens.netaddr import parse_listen

DASHBOARD_EXAMPLES = """\
examples:
  gpulens dashboard --config gpulens.toml                 # http://127.0.0.1:8050
  gpulens dashboard --db sqlite:///gpulens.db --listen 0.0.0.0:8050 --basic-auth-file /etc/gpulens/htpasswd
  gpulens dashboard --db prometheus+http://prometheus:9090   # over the Prometheus you already run
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
    p.add_argument(
        "--basic-auth-file",
        default=None,
        help="htpasswd-style file of user:bcrypt-hash lines; user:hash:operator lets that user silence alerts "
        "(everyone else in the file only reads)",
    )
    p.add_argument(
        "--role-header",
        default=None,
        metavar="NAME",
        help="take each visitor's role from this header, set by the site's reverse proxy after its sign-on "
        "(X-Gpulens-Role: operator; anything else reads only); only behind a proxy that always sets it",
    )
    p.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], default="info", help="logging verbosity"
    )
    apply_env_twins(p, "GPULENS_DASHBOARD_")
    p.set_defaults(func=_run_dashboard)


def _run_dashboard(args: argparse.Namespace) -> int:
    from gpulens.alerts.service import SqlAlertReader
    from gpulens.dashboard.server import run_dashboard

    try:
        host, port = parse_listen(args.listen)
    except ValueError as exc:
        raise UsageError(f"--listen: {exc}") from None
    settings = settings_from(args)
    _check_can_listen(host, port)
    if _is_prometheus(settings.db_url):
        with stop_on_signals() as stop:
            return _run_over_prometheus(settings, host, port, args.basic_auth_file, stop)
    checked_db_url(args, settings)  # an unreachable database is shown on the pages; an unusable URL stops here
    with stop_on_signals() as stop:
        return run_dashboard(
            settings,
            host=host,
            port=port,
            basic_auth_file=args.basic_auth_file,
            alerts=SqlAlertReader,
            role_header=args.role_header,
            announce=lambda line: print(line, file=sys.stderr, flush=True),
            stop=stop,
        )


def _check_can_listen(host: str, port: int) -> None:
    """Fail in one line if ``host:port`` cannot be bound (the HTTP server would print and exit on its own)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        shown = f"[{host}]" if ":" in host else host
        reason = exc.strerror or str(exc)
        message = f"--listen '{shown}:{port}': cannot listen: {reason} (expected a free port on a local address)"
        raise CliError(message) from None


def _is_prometheus(url: str) -> bool:
    from gpulens.storage.connect import is_prometheus_url

    return is_prometheus_url(url)


def _run_over_prometheus(settings: Any, host: str, port: int, basic_auth_file: str | None, stop: Any) -> int:
    """The dashboard over a read-only Prometheus store; alerts from the alert state store when there is one."""
    from pathlib import Path

    from gpulens.alerts.service import SqlAlertReader
    from gpulens.dashboard.server import run_dashboard
    from gpulens.storage.connect import open_existing_database, open_reader

    store = open_reader(settings.db_url, settings)
    state = None
    state_file = settings.state_url.removeprefix("sqlite:///")
    if not settings.state_url.startswith("sqlite:///") or Path(state_file).exists():
        state = open_existing_database(settings.state_url)
    try:
        return run_dashboard(
            store,
            host=host,
            port=port,
            basic_auth_file=basic_auth_file,
            alert_reader=SqlAlertReader(state) if state is not None else None,
            announce=lambda line: print(line, file=sys.stderr, flush=True),
            stop=stop,
        )
    finally:
        store.close()
        if state is not None:
            state.close()
