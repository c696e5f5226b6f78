"""``gpulens alerts test-notify``: alerting tools."""

from __future__ import annotations

import argparse
from typing import Any

from gpulens.cli.base import CliError, Formatter, Parser, add_log_level


def register(sub: Any) -> None:
    p = sub.add_parser(
        "alerts",
        help="alerting tools",
        description="Alerting tools.",
        epilog="example:\n  gpulens alerts test-notify ops-slack --config gpulens.toml\n",
        formatter_class=Formatter,
    )
    asub = p.add_subparsers(dest="alerts_command", metavar="ACTION", parser_class=Parser)
    asub.required = True
    test = asub.add_parser("test-notify", help="send a test notification to a receiver now")
    test.add_argument("receiver", help="a receiver name from [[alerts.receivers]]")
    test.add_argument("--config", required=True, help="gpulens.toml with the receiver")
    add_log_level(test)
    test.set_defaults(func=_run_test_notify)


def _run_test_notify(args: argparse.Namespace) -> int:
    import time

    from alerts.config import build_notifiers
    from alerts.notify import DeliveryError, probe_notification
    from alerts.service import alerting_config
    from gpulens.settings import load_settings

    config = alerting_config(load_settings(args.config))
    notifiers = build_notifiers(config.receivers, dashboard_url=config.dashboard_url)
    notifier = notifiers.get(args.receiver)
    if notifier is None:
        raise CliError(f"no receiver {args.receiver!r} (the config has: {', '.join(notifiers) or 'none'})")
    note = probe_notification(args.receiver, time.time())
    try:
        notifier.send(note.alerts, group_labels=note.group_labels, status=note.status, group_key=note.group_key)
    except DeliveryError as exc:
        raise CliError(exc.message) from None
    print(f"test notification delivered to {args.receiver}")
    return 0
