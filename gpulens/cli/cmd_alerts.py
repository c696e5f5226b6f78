"""``gpulens alerts run`` and ``gpulens alerts test-notify``: the alert engine over a store, and alerting tools."""

from __future__ import annotations

import argparse
from typing import Any

from gpulens.cli.base import (
    CliError,
    Formatter,
    Parser,
    add_db_flags,
    add_log_level,
    positive_duration,
    settings_from,
)

RUN_EXAMPLES = """\
examples:
  # the built-in rules over the Prometheus you already run; alert state in a local SQLite file
  gpulens alerts run --db prometheus+http://prometheus:9090 --config gpulens.toml --interval 30s
  # the rules once, over the whole cluster, beside sharded collectors writing one PostgreSQL
  gpulens alerts run --db postgresql+psycopg://gpulens@db/gpulens --config gpulens.toml
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "alerts",
        help="alerting tools",
        description="Alerting tools.",
        epilog=RUN_EXAMPLES + "  gpulens alerts test-notify ops-slack --config gpulens.toml\n",
        formatter_class=Formatter,
    )
    asub = p.add_subparsers(dest="alerts_command", metavar="ACTION", parser_class=Parser)
    asub.required = True
    run = asub.add_parser(
        "run",
        help="evaluate the alert rules over a store every interval and notify",
        description="Reads the whole cluster from the store each interval (a SQL store, or read-only Prometheus, "
        "Thanos, Mimir or VictoriaMetrics), evaluates the built-in and configured rules once over every GPU, and "
        "notifies the [alerts] receivers through the durable outbox. Alert states, the outbox and silences live in a "
        "small writable store: the SQL store itself, or with a Prometheus --db the --state-db ([database] state_url).",
        epilog=RUN_EXAMPLES,
        formatter_class=Formatter,
    )
    add_db_flags(run)
    run.add_argument("--interval", type=positive_duration, default=30.0, help="time between rule rounds (30s)")
    run.add_argument("--state-db", default=None, help="alert state store beside a Prometheus --db (SQL URL)")
    run.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], default="info", help="logging verbosity"
    )
    run.set_defaults(func=_run_rules)
    test = asub.add_parser("test-notify", help="send a test notification to a receiver now")
    test.add_argument("receiver", help="a receiver name from [[alerts.receivers]]")
    test.add_argument("--config", required=True, help="gpulens.toml with the receiver")
    add_log_level(test)
    test.set_defaults(func=_run_test_notify)


def _run_test_notify(args: argparse.Namespace) -> int:
    import time

    from gpulens.alerts.config import build_notifiers
    from gpulens.alerts.notify import DeliveryError, probe_notification
    from gpulens.alerts.service import alerting_config
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


def _run_rules(args: argparse.Namespace) -> int:
    import logging
    import sys
    import time

    from gpulens.alerts.promround import round_reader
    from gpulens.alerts.service import AlertService, alerting_config
    from gpulens.alerts.storeround import run_store_rules
    from gpulens.cli.lifecycle import stop_on_signals
    from gpulens.gcpause import tune_garbage_collector
    from gpulens.storage.connect import is_prometheus_url, open_database, open_reader
    from gpulens.storage.prometheus import PromReader

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = settings_from(args)
    alerting = alerting_config(settings)  # validated before anything starts
    prometheus = is_prometheus_url(settings.db_url)
    state_url = args.state_db or (settings.state_url if prometheus else settings.db_url)
    store = open_reader(settings.db_url, settings)
    try:
        state = open_database(state_url)
        try:
            # Started: its notification worker delivers what the rounds decide, apart from them.
            service = AlertService(state, alerting, interval_s=args.interval).start()
            tune_garbage_collector()  # each round reads 8,000 GPUs' records into a 30-minute history (gcpause)
            announce = f"gpulens alerts run: rules every {args.interval:g}s over {store.url_redacted}"
            print(f"{announce}, alert state in {state.url_redacted}", file=sys.stderr, flush=True)
            read = None
            if isinstance(store, PromReader):  # every GPU's round fields, the rest where a rule could fire
                read = round_reader(store, service.engine.rules, lambda: service.engine.states)
            try:
                with stop_on_signals() as stop:
                    run_store_rules(
                        store, service.hook, interval_s=args.interval, stop=stop, clock=time.time, read=read
                    )
            finally:
                service.close()
        finally:
            state.close()
    finally:
        store.close()
    return 0
