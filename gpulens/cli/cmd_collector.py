"""``gpulens collector``: the scrape loop's flags, and starting it with the alert engine."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from gpulens.cli.base import (
    CliError,
    Formatter,
    UsageError,
    add_db_flags,
    checked_db_url,
    database_errors,
    database_origin,
    positive_duration,
    settings_from,
)
from gpulens.cli.envtwins import apply_env_twins
from gpulens.cli.lifecycle import stop_on_signals
from gpulens.httpfetch import check_url, redact_url
from gpulens.netaddr import parse_listen

COLLECTOR_EXAMPLES = """\
examples:
  # everything from a config file (docs/configuration.md)
  gpulens collector --config gpulens.toml
  # a quick start: two exporters into the default SQLite file, every 5 seconds
  gpulens collector --target http://gpu-node-07:9410 --target http://gpu-node-08:9410 --interval 5s
  # a dcgm-exporter is given by its /metrics URL
  gpulens collector --target http://gpu-node-09:9400/metrics
  # one of four collectors sharing a cluster, writing to PostgreSQL (password from the environment)
  GPULENS_DB_URL=postgresql+psycopg://gpulens:secret@db/gpulens gpulens collector --config gpulens.toml --shard 1/4
  # its own /metrics on every interface, over HTTPS with basic auth (docs/self-health.md)
  gpulens collector --config gpulens.toml --listen 0.0.0.0:9411 --web-config /etc/gpulens/web.yml
  # after installing a newer gpulens: plan the schema upgrade, back up, then migrate (docs/upgrades.md)
  gpulens db upgrade --plan --config gpulens.toml && gpulens collector --config gpulens.toml --migrate
  # an HA pair: the same command on a second host; one is active, the other takes over if it dies
  GPULENS_DB_URL=postgresql+psycopg://gpulens:secret@db/gpulens gpulens collector --config gpulens.toml
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "collector",
        help="scrape every node on a schedule and keep the history in SQL",
        description="Scrapes gpulens exporters and dcgm-exporters concurrently, writes each round to SQLite or "
        "PostgreSQL (spooling to disk while the database is unreachable) and serves its own /metrics.",
        epilog=COLLECTOR_EXAMPLES,
        formatter_class=Formatter,
    )
    add_db_flags(p)
    p.add_argument("--target", action="append", default=[], help="exporter base URL or dcgm /metrics URL; repeatable")
    p.add_argument("--interval", type=positive_duration, default=None, help="scrape interval (default 10s)")
    p.add_argument("--shard", default=None, help="I/N: scrape the targets whose name hashes to I")
    p.add_argument("--listen", default=None, help="where to serve the collector's /metrics (default 127.0.0.1:9411)")
    p.add_argument(
        "--web-config",
        default=None,
        metavar="FILE",
        help="TLS and basic auth for the collector's /metrics (the exporter's --web-config format)",
    )
    p.add_argument("--spool-dir", default=None, help="where rounds wait while the database is down")
    p.add_argument(
        "--migrate",
        action="store_true",
        help="migrate an older database schema at start-up (without it the collector stops and says what to run; an "
        "empty database always gets the schema). Plan it first: gpulens db upgrade --plan",
    )
    p.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], default="info", help="logging verbosity"
    )
    apply_env_twins(p, "GPULENS_COLLECTOR_")
    p.set_defaults(func=_run_collector)


def collector_settings(args: argparse.Namespace) -> Any:
    from gpulens.settings import TargetSettings, default_timeout_s, parse_shard

    settings = settings_from(args)
    changes: dict[str, Any] = {}
    if args.target:
        extra = []
        for url in args.target:
            try:
                check_url(url, "http://gpu-node-07:9410")
            except ValueError:
                raise UsageError(
                    f"--target {redact_url(url)!r}: expected an http:// or https:// URL like http://gpu-node-07:9410 "
                    "(a gpulens exporter) or http://gpu-node-07:9400/metrics (a dcgm-exporter)"
                ) from None
            url = url.rstrip("/")
            kind = "dcgm" if url.endswith("/metrics") else "gpulens"
            extra.append(TargetSettings(url=url, name=url, kind=kind))
        changes["targets"] = (*settings.targets, *extra)
    if args.interval is not None:
        changes["interval_s"] = args.interval
        if settings.raw.get("collector", {}).get("timeout") is None:
            changes["timeout_s"] = default_timeout_s(args.interval)
        elif settings.timeout_s > args.interval:
            raise UsageError(
                f"--interval {args.interval:g}: shorter than collector.timeout ({settings.timeout_s:g}s) in the "
                "config; a round would overrun the next tick"
            )
    if args.shard is not None:
        try:
            changes["shard"] = parse_shard(args.shard)
        except ValueError as exc:
            raise UsageError(f"--shard: {exc}") from None
    if args.listen is not None:
        try:
            parse_listen(args.listen)
        except ValueError as exc:
            raise UsageError(f"--listen: {exc}") from None
        changes["listen"] = args.listen
    if args.spool_dir is not None:
        changes["spool_dir"] = args.spool_dir
    if args.web_config is not None:
        changes["web_config"] = args.web_config
    return dataclasses.replace(settings, **changes)


def _run_collector(args: argparse.Namespace) -> int:
    from gpulens.alerts.config import build_notifiers
    from gpulens.alerts.service import AlertService, alerting_config
    from gpulens.alerts.storeround import SharedStoreRules
    from gpulens.collector.pair import WhileActive
    from gpulens.collector.runner import run_collector
    from gpulens.storage.connect import refuse_read_only

    settings = collector_settings(args)
    refuse_read_only(settings.db_url, "gpulens collector")
    if not settings.targets and not settings.file_sd:
        raise UsageError("no targets: give --target URL or a --config with [[targets]] or [[file_sd]]")
    alerting = alerting_config(settings)  # validated before anything starts
    checked_db_url(args, settings)
    _make_spool_dir(args, settings.spool_dir)

    def hooks(db: Any) -> list[Any]:
        # The rules and their notification worker run in the active collector of an HA pair only (WhileActive);
        # they stop when the collector does (runner closes them).
        notifiers = build_notifiers(alerting.receivers, dashboard_url=alerting.dashboard_url)  # secrets read now

        def rules() -> Any:
            return AlertService(
                db, alerting, interval_s=settings.interval_s, notifiers=notifiers, load_at_first_round=True
            ).start()

        if settings.shard[1] == 1:
            return [WhileActive(rules)]
        # Sharded: the rules run once over the whole store, in the collector that holds the election lock
        # (PostgreSQL), or in `gpulens alerts run` (SQLite has no lock to elect with).
        if db.dialect != "postgresql":
            print(
                "collector: sharded over SQLite, so no collector runs the alert rules; run gpulens alerts run --db "
                "<the same URL> beside them",
                file=sys.stderr,
                flush=True,
            )
            return []
        return [WhileActive(lambda: SharedStoreRules(db, rules, max_age_s=max(3 * settings.interval_s, 30.0)))]

    with stop_on_signals() as stop, database_errors(database_origin(args, settings)):
        return run_collector(settings, _announce, stop, hooks=hooks, migrate=args.migrate)


def _announce(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _make_spool_dir(args: argparse.Namespace, spool_dir: str) -> None:
    from pathlib import Path

    try:
        Path(spool_dir).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        where = "--spool-dir" if args.spool_dir is not None else "collector.spool_dir"
        reason = exc.strerror or str(exc)
        raise CliError(
            f"{where} {spool_dir!r}: cannot create the directory: {reason} (expected a writable path)"
        ) from None
