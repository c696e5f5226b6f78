"""``gpulens alerts run``, ``list`` and ``test-notify``: the alert engine over a store, and alerting tools."""

from __future__ import annotations

import argparse
from typing import Any

from gpulens.cli.base import (
    CliError,
    Formatter,
    Parser,
    add_db_flags,
    add_log_level,
    database_errors,
    database_origin,
    positive_duration,
    settings_from,
)

RUN_EXAMPLES = """\
examples:
  # the built-in rules over the Prometheus you already run; alert state in a local SQLite file
  gpulens alerts run --db prometheus+http://prometheus:9090 --config gpulens.toml --interval 30s
  # the rules once, over the whole cluster, beside sharded collectors writing one PostgreSQL
  gpulens alerts run --db postgresql+psycopg://gpulens@db/gpulens --config gpulens.toml
  # an HA pair: the same command on a second host; the one holding the rules lock in PostgreSQL runs the rules
  gpulens alerts run --db postgresql+psycopg://gpulens@db/gpulens --config gpulens.toml
"""


LIST_EXAMPLES = """\
examples:
  gpulens alerts list --db sqlite:////var/lib/gpulens/gpulens.db
  gpulens alerts list --db prometheus+http://prometheus:9090 --state-db sqlite:////var/lib/gpulens/alerts.db --json
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "alerts",
        help="alerting tools",
        description="Alerting tools.",
        epilog=RUN_EXAMPLES
        + LIST_EXAMPLES.removeprefix("examples:\n")
        + "  gpulens alerts test-notify ops-slack --config gpulens.toml\n",
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
    lst = asub.add_parser(
        "list",
        help="what fires and what is pending now",
        description="The alerts firing and pending now, from the stored alert states: the SQL store of the "
        "collectors (or of alerts run), or with a Prometheus --db the alert state store beside it (--state-db, "
        "[database] state_url). Firing first, the most severe first.",
        epilog=LIST_EXAMPLES,
        formatter_class=Formatter,
    )
    add_db_flags(lst)
    lst.add_argument("--state-db", default=None, help="alert state store beside a Prometheus --db (SQL URL)")
    lst.add_argument("--json", action="store_true", help="print one JSON array of alerts")
    add_log_level(lst)
    lst.set_defaults(func=_run_list)
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
    destinations = config.destinations().get(args.receiver)
    if destinations is None:
        raise CliError(f"no receiver {args.receiver!r} (the config has: {', '.join(config.destinations()) or 'none'})")
    note = probe_notification(args.receiver, time.time())
    for destination in destinations:  # each URL of an alertmanager receiver
        try:
            notifiers[destination].send(
                note.alerts, group_labels=note.group_labels, status=note.status, group_key=note.group_key
            )
        except DeliveryError as exc:
            raise CliError(exc.message) from None
    print(
        f"test notification delivered to {args.receiver}"
        + (f" ({len(destinations)} URLs)" if len(destinations) > 1 else "")
    )
    return 0


def _run_list(args: argparse.Namespace) -> int:
    import json

    from gpulens.alerts.service import SqlAlertReader
    from gpulens.cli.table import render_table
    from gpulens.storage.connect import is_prometheus_url, open_existing_database

    settings = settings_from(args, reads_demo=True)
    url = args.state_db or (settings.state_url if is_prometheus_url(settings.db_url) else settings.db_url)
    origin = "--state-db" if args.state_db else database_origin(args, settings)
    with database_errors(origin):
        db = open_existing_database(url)
        try:
            active = SqlAlertReader(db).active()
        finally:
            db.close()
    ordered = sorted(active, key=_order)
    if args.json:
        print(json.dumps([alert_row(a) for a in ordered]))
    else:
        print(render_table([_table_row(a) for a in ordered], _COLUMNS), end="")
    return 0


_SEVERITY_ORDER = ("critical", "warning", "info")
_SUBJECT = ("node", "gpu", "job_id")
_COLUMNS = ("alertname", "state", "severity", *_SUBJECT, "since", "value", "labels", "summary")


def _order(alert: Any) -> tuple[Any, ...]:
    rank = _SEVERITY_ORDER.index(alert.severity) if alert.severity in _SEVERITY_ORDER else len(_SEVERITY_ORDER)
    return (alert.state != "firing", rank, alert.fired_at or alert.active_since, alert.rule)


def _since(alert: Any) -> float:
    """When a firing alert fired; when a pending one began."""
    return float(alert.fired_at if alert.state == "firing" and alert.fired_at is not None else alert.active_since)


def alert_row(alert: Any) -> dict[str, Any]:
    """One alert as ``alerts list --json`` prints it."""
    from gpulens.config import format_timestamp

    return {
        "alertname": alert.rule,
        "state": alert.state,
        "severity": alert.severity,
        "labels": dict(alert.labels),
        "since": format_timestamp(_since(alert)),
        "value": alert.value,
        "summary": alert.summary,
        "muted": alert.muted,
        "annotations": dict(alert.annotations),
        "fingerprint": alert.fingerprint,
    }


def _table_row(alert: Any) -> dict[str, Any]:
    labels = alert.labels
    rest = ",".join(f"{k}={v}" for k, v in labels.items() if k not in ("alertname", "severity", "uuid", *_SUBJECT))
    return {
        "alertname": alert.rule,
        "state": alert.state + (f" ({alert.muted})" if alert.muted else ""),
        "severity": alert.severity,
        **{k: labels.get(k) for k in _SUBJECT},
        "since": _since(alert),
        "value": alert.value,
        "labels": rest or None,
        "summary": alert.summary,
    }


def _run_rules(args: argparse.Namespace) -> int:
    import logging
    import sys
    import time

    from gpulens.alerts.config import build_notifiers
    from gpulens.alerts.culpritaddress import from_store
    from gpulens.alerts.engine import AlertEngine
    from gpulens.alerts.promround import round_reader
    from gpulens.alerts.service import AlertService, alerting_config
    from gpulens.alerts.storeround import rules_leadership, run_store_rules
    from gpulens.cli.lifecycle import stop_on_signals
    from gpulens.collector.pair import WhileActive
    from gpulens.gcpause import tune_garbage_collector
    from gpulens.storage.connect import is_prometheus_url, open_database, open_prometheus, open_reader
    from gpulens.storage.reading import StoreReader

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = settings_from(args)
    alerting = alerting_config(settings)  # validated before anything starts
    notifiers = build_notifiers(alerting.receivers, dashboard_url=alerting.dashboard_url)  # secrets read now
    prometheus = is_prometheus_url(settings.db_url)
    state_url = args.state_db or (settings.state_url if prometheus else settings.db_url)
    prom = open_prometheus(settings.db_url, settings) if prometheus else None
    store: StoreReader = prom if prom is not None else open_reader(settings.db_url, settings)
    try:
        state = open_database(state_url)
        # An HA pair: the process holding the rules lock in the state store (PostgreSQL) evaluates and delivers.
        leadership = rules_leadership(state, what="this gpulens alerts run")
        # Built on becoming active: its notification worker delivers what the rounds decide, apart from them.
        rules = WhileActive(
            lambda: AlertService(
                state,
                alerting,
                interval_s=args.interval,
                notifiers=notifiers,
                load_at_first_round=True,
                gpu_addresses=from_store(store),
            ).start()
        )
        try:
            tune_garbage_collector()  # each round reads 8,000 GPUs' records into a 30-minute history (gcpause)
            announce = f"gpulens alerts run: rules every {args.interval:g}s over {store.url_redacted}"
            print(f"{announce}, alert state in {state.url_redacted}", file=sys.stderr, flush=True)
            read = None
            if prom is not None:  # every GPU's round fields, the rest where a rule could fire

                def engine() -> AlertEngine | None:
                    """The engine while active; None until its first round, which then reads every GPU whole (a
                    process that has just become active must see each GPU its stored alerts name)."""
                    service = rules.hook
                    return service.engine if isinstance(service, AlertService) else None

                read = round_reader(prom, alerting.rules, engine)
            with stop_on_signals() as stop:
                run_store_rules(
                    store,
                    rules,
                    interval_s=args.interval,
                    stop=stop,
                    clock=time.time,
                    active=leadership.check,
                    read=read,
                )
        finally:
            rules.close()  # the notification worker stops before the lock goes to the standby
            leadership.release()
            state.close()
    finally:
        store.close()
    return 0
