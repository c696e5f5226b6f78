"""``gpulens collector``: the scrape loop's flags, and starting it with the alert engine."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from gpulens.cli.base import Formatter, UsageError, add_db_flags, positive_duration, settings_from
from gpulens.cli.envtwins import apply_env_twins
from gpulens.cli.lifecycle import stop_on_signals

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
    p.add_argument("--spool-dir", default=None, help="where rounds wait while the database is down")
    p.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], default="info", help="logging verbosity"
    )
    apply_env_twins(p, "GPULENS_COLLECTOR_")
    p.set_defaults(func=_run_collector)


def collector_settings(args: argparse.Namespace) -> Any:
    from gpulens.settings import TargetSettings, parse_shard

    settings = settings_from(args)
    changes: dict[str, Any] = {}
    if args.target:
        extra = []
        for url in args.target:
            if not url.startswith(("http://", "https://")):
                raise UsageError(f"--target {url!r}: expected an http:// or https:// URL")
            url = url.rstrip("/")
            kind = "dcgm" if url.endswith("/metrics") else "gpulens"
            extra.append(TargetSettings(url=url, name=url, kind=kind))
        changes["targets"] = (*settings.targets, *extra)
    if args.interval is not None:
        changes["interval_s"] = args.interval
        changes["timeout_s"] = min(settings.timeout_s, args.interval)
    if args.shard is not None:
        try:
            changes["shard"] = parse_shard(args.shard)
        except ValueError as exc:
            raise UsageError(f"--shard: {exc}") from None
    if args.listen is not None:
        changes["listen"] = args.listen
    if args.spool_dir is not None:
        changes["spool_dir"] = args.spool_dir
    return dataclasses.replace(settings, **changes)


def _run_collector(args: argparse.Namespace) -> int:
    from alerts.service import AlertService, alerting_config
    from alerts.storeround import RuleElection
    from collector.runner import run_collector
    from storage.connect import refuse_read_only

    settings = collector_settings(args)
    refuse_read_only(settings.db_url, "gpulens collector")
    if not settings.targets and not settings.file_sd:
        raise UsageError("no targets: give --target URL or a --config with [[targets]] or [[file_sd]]")
    alerting = alerting_config(settings)  # validated before anything starts

    def hooks(db: Any) -> list[Any]:
        if settings.shard[1] == 1:
            return [AlertService(db, alerting).hook]
        # Sharded: the rules run once over the whole store, in the collector that holds the election lock
        # (PostgreSQL), or in `gpulens alerts run` (SQLite has no lock to elect with).
        election = RuleElection(
            db, lambda: AlertService(db, alerting).hook, max_age_s=max(3 * settings.interval_s, 30.0)
        )
        if not election.supported:
            print(
                "collector: sharded over SQLite, so no collector runs the alert rules; run gpulens alerts run --db "
                "<the same URL> beside them",
                file=sys.stderr,
                flush=True,
            )
            return []
        return [election]

    with stop_on_signals() as stop:
        return run_collector(settings, lambda line: print(line, file=sys.stderr, flush=True), stop, hooks=hooks)
