"""``gpulens report --by user|account|partition --since 30d``: GPU usage per group, as a table, JSON or CSV."""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from typing import Any

from gpulens.cli.base import (
    Formatter,
    UsageError,
    add_db_flags,
    add_log_level,
    database_errors,
    database_origin,
    positive_duration,
    settings_from,
)

REPORT_EXAMPLES = """\
examples:
  gpulens report --by user --since 30d                 # who held GPU-hours this month, and how much sat idle
  gpulens report --by account --since 7d --csv > week.csv
  gpulens report --by partition --since 1d --json
  gpulens report --by user --since 1d --db prometheus+http://prometheus:9090
"""

COLUMNS = (
    "group",
    "jobs",
    "gpu_hours",
    "used_gpu_hours",
    "idle_ratio",
    "energy_kwh",
    "cost",
    "currency",
    "hung_jobs",
    "hung_seconds",
)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        help="GPU-hours, idle share, energy, cost and hung jobs per user, account or partition",
        description="Adds up the accounting summaries of the jobs that held a GPU in the period (each job whole: "
        "the summary stored when it ended, or one computed now for a running job), per user, account or partition: "
        "GPU-hours allocated and used, the idle share of the allocated time, energy, cost, and the jobs that hung "
        "(a CommunicationStall alert) with how long. Prices from the config's [accounting]. Over a SQL store or "
        "Prometheus (prometheus+http://...: the same sums from the exporters' series).",
        epilog=REPORT_EXAMPLES,
        formatter_class=Formatter,
    )
    add_db_flags(p)
    p.add_argument("--by", choices=("user", "account", "partition"), required=True, help="what to group the jobs by")
    p.add_argument(
        "--since", type=positive_duration, default=30 * 86400.0, help="the period, back from now (default 30d)"
    )
    output = p.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="a JSON array of rows")
    output.add_argument("--csv", action="store_true", help="CSV with a header row")
    add_log_level(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from gpulens.clock import SystemClock
    from gpulens.storage import usagereport
    from gpulens.storage.connect import open_reader

    settings = settings_from(args)
    if args.since <= 0:
        raise UsageError("--since: expected a positive duration like 30d")
    now = SystemClock().now()
    with database_errors(database_origin(args, settings)):
        store = open_reader(settings.db_url, settings)
        try:
            rows = store.usage(args.by, now - args.since, now, settings.prices)
        finally:
            store.close()
    jobs = sum(r.jobs for r in rows)
    docs = [{c: getattr(r, c) for c in COLUMNS} for r in rows]
    if args.json:
        sys.stdout.write(json.dumps(docs, indent=2) + "\n")
    elif args.csv:
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(docs)
        sys.stdout.write(out.getvalue())
    else:
        sys.stdout.write(format_rows(docs, args.by))
    if jobs >= usagereport.MAX_JOBS:
        print(f"gpulens report: only the first {usagereport.MAX_JOBS} jobs of the period are counted", file=sys.stderr)
    return 0


def _number(value: float | None, digits: int, scale: float = 1.0, unit: str = "") -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}{unit}"


def format_rows(docs: list[dict[str, Any]], by: str) -> str:
    """The rows as an aligned table for the terminal."""
    from gpulens.cli.table import render_table

    if not docs:
        return "(no jobs in the period)\n"
    table = [
        {
            by: d["group"],
            "jobs": str(d["jobs"]),
            "gpu_hours": _number(d["gpu_hours"], 2),
            "used_gpu_hours": _number(d["used_gpu_hours"], 2),
            "idle": _number(d["idle_ratio"], 1, 100, "%"),
            "energy_kwh": _number(d["energy_kwh"], 2),
            "cost": f"{d['cost']:.2f} {d['currency']}",
            "hung": f"{d['hung_jobs']} ({d['hung_seconds'] / 60:.0f} min)" if d["hung_jobs"] else "0",
        }
        for d in docs
    ]
    return render_table(table)
