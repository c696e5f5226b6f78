"""``gpulens rules``: the built-in rules in another system's format (alerting rules, or the recording rules the
Prometheus reader uses), and ``rules doctor``: which recorded series a Prometheus holds."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gpulens.cli.base import (
    CliError,
    Formatter,
    Parser,
    add_db_flags,
    add_log_level,
    database_errors,
    database_origin,
    positive_int,
    settings_from,
)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "rules",
        help="the built-in alert rules and the recording rules",
        description="The built-in alert rules, as the collector evaluates them or as a Prometheus rules file; the "
        "recording rules that make the dashboard over Prometheus fast (docs/prometheus-recording.md).",
        epilog="examples:\n  gpulens rules list                              # every builtin, and where it runs\n"
        "  gpulens rules list --config gpulens.toml        # as your overrides leave them\n"
        "  gpulens rules export --format prometheus > gpulens-rules.yml\n"
        "  gpulens rules export --format prometheus --config gpulens.toml   # with your threshold overrides\n"
        "  gpulens rules export --format prometheus-recording > gpulens-recording.yml\n"
        "  gpulens rules export --format prometheus-recording --scrape-interval 30 --interval 60\n"
        "  gpulens rules doctor --db prometheus+http://prometheus:9090\n",
        formatter_class=Formatter,
    )
    rsub = p.add_subparsers(dest="rules_command", metavar="ACTION", parser_class=Parser)
    rsub.required = True
    listing = rsub.add_parser(
        "list",
        help="the built-in alert rules: severity, for, thresholds, and where each runs",
        description="Prints the rule catalogue: each built-in rule's severity, for, keep_firing_for and thresholds "
        "(with the config's overrides), and whether it runs in the engine only or also as an exported Prometheus "
        "rule. A rule PromQL cannot say is listed as engine only, with the reason.",
        epilog="examples:\n  gpulens rules list\n  gpulens rules list --config gpulens.toml\n"
        "  gpulens rules list --markdown     # the table of docs/alerts.md\n",
        formatter_class=Formatter,
    )
    listing.add_argument("--config", default=None, help="gpulens.toml whose [alerts] overrides apply")
    listing.add_argument("--markdown", action="store_true", help="a Markdown table (as docs/alerts.md has it)")
    add_log_level(listing)
    listing.set_defaults(func=_run_rules_list)
    export = rsub.add_parser("export", help="print the rules in another system's format")
    export.add_argument(
        "--format",
        choices=["prometheus", "prometheus-recording"],
        default="prometheus",
        help="prometheus: the alerting rules; prometheus-recording: the recording rules the Prometheus reader uses",
    )
    export.add_argument("--config", default=None, help="gpulens.toml whose [alerts] overrides apply")
    export.add_argument(
        "--interval", type=positive_int, default=None, help="recording rules: seconds between evaluations (180)"
    )
    export.add_argument(
        "--scrape-interval",
        type=positive_int,
        default=None,
        help="recording rules: the scrape interval in seconds (15); rates are taken over 4 scrapes",
    )
    add_log_level(export)
    export.set_defaults(func=_run_rules_export)
    doctor = rsub.add_parser(
        "doctor",
        help="which recorded series a Prometheus holds, and which are stale",
        description="Lists every recorded series of the recording rules as present, stale (not evaluated lately) "
        "or missing, and which dashboard pages read raw series for want of them. Exit status 1 unless all are "
        "present.",
        epilog="example:\n  gpulens rules doctor --db prometheus+http://prometheus:9090\n",
        formatter_class=Formatter,
    )
    add_db_flags(doctor)
    add_log_level(doctor)
    doctor.set_defaults(func=_run_rules_doctor)


def _run_rules_export(args: argparse.Namespace) -> int:
    if args.format == "prometheus-recording":
        from gpulens.storage.prometheus.recording import INTERVAL_S, SCRAPE_S, rules_yaml

        sys.stdout.write(rules_yaml(args.interval or INTERVAL_S, args.scrape_interval or SCRAPE_S))
        return 0
    if args.interval is not None or args.scrape_interval is not None:
        raise CliError("--interval and --scrape-interval apply to --format prometheus-recording only")
    from gpulens.alerts.promexport import prometheus_rules_yaml
    from gpulens.alerts.service import alerting_config
    from gpulens.settings import default_settings, load_settings

    settings = load_settings(args.config) if args.config else default_settings()
    sys.stdout.write(prometheus_rules_yaml(alerting_config(settings).rules))
    return 0


def _run_rules_list(args: argparse.Namespace) -> int:
    from gpulens.alerts.catalogue import GPULENS_ONLY, definition
    from gpulens.alerts.cataloguedoc import HEADER, markdown_table, rows
    from gpulens.alerts.service import alerting_config
    from gpulens.cli.table import render_table
    from gpulens.settings import default_settings, load_settings

    settings = load_settings(args.config) if args.config else default_settings()
    rules = [r for r in alerting_config(settings).rules if definition(r) is not None]
    if args.markdown:
        sys.stdout.write(markdown_table(rules))
        return 0
    columns = [h.strip("`") for h in HEADER]
    table = [dict(zip(columns, (cell.replace("`", "") for cell in row), strict=True)) for row in rows(rules)]
    sys.stdout.write(render_table(table, [*columns[:4], columns[5], columns[4]]))  # the widest column last
    for name, why in GPULENS_ONLY.items():
        sys.stdout.write(f"{name} runs in the engine only: {why}.\n")
    return 0


def _run_rules_doctor(args: argparse.Namespace) -> int:
    from gpulens.storage.connect import is_prometheus_url
    from gpulens.storage.prometheus.client import PromClient
    from gpulens.storage.prometheus.recorded import status
    from gpulens.storage.prometheus.recording import PAGE_NEEDS, RULE_FILE

    settings = settings_from(args)
    if not is_prometheus_url(settings.db_url or ""):
        raise CliError("rules doctor reads a Prometheus: give --db prometheus+http://HOST:PORT")
    with database_errors(database_origin(args, settings)):
        client = PromClient(settings.db_url, settings.store_auth, environ=None)
        import time

        interval, states = status(client, time.time())
    lines = [
        f"recording rules at {client.url_redacted}: "
        + (f"evaluated every {interval:g}s" if interval else "not evaluated")
    ]
    for name, state, age in states:
        lines.append(f"  {state:<8} {name}" + (f"  (newest {age:.0f}s old)" if age is not None else ""))
    bad = {name for name, state, _ in states if state != "present"}
    raw = [page for page, needs in PAGE_NEEDS.items() if bad & set(needs)]
    counts = {s: sum(1 for _, got, _ in states if got == s) for s in ("present", "stale", "missing")}
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()))
    if raw:
        lines.append(
            f"pages reading raw series: {', '.join(raw)}; load deploy/prometheus/rules/{RULE_FILE} "
            "(gpulens rules export --format prometheus-recording) and let Prometheus evaluate it"
        )
    sys.stdout.write("\n".join(lines) + "\n")
    return 1 if bad else 0
