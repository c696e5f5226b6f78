"""``gpulens job-summary JOB_ID``: a job's accounting summary, as stored when it ended or computed now."""

from __future__ import annotations

import argparse
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
    settings_from,
)
from gpulens.config import format_duration, format_timestamp

EXAMPLES = """\
examples:
  gpulens job-summary 4242                    # GPU-hours, energy, utilization, idle share, stall time, cost
  gpulens job-summary ml/train-0 --json       # a Kubernetes pod's job
  gpulens job-summary 4242 --json --compact   # one line, for Slurm's AdminComment (deploy/slurm/epilog-slurmctld.sh)
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "job-summary",
        help="a job's accounting summary: GPU-hours, energy, utilization, idle share, stall time, cost, carbon",
        description="Prints the summary stored when the job ended; for a job still running (or one that ended "
        "before the store kept summaries) it is computed now, over the job's life so far. Prices come from "
        "[accounting] in the config.",
        epilog=EXAMPLES,
        formatter_class=Formatter,
    )
    p.add_argument("job_id", metavar="JOB_ID", help="the job: a Slurm job id, namespace/pod, ...")
    add_db_flags(p)
    p.add_argument("--json", action="store_true", help="print the summary as a JSON object")
    p.add_argument("--compact", action="store_true", help="with --json: one line, no spaces")
    add_log_level(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from gpulens.clock import SystemClock
    from gpulens.storage import jobsummary
    from gpulens.storage.connect import open_existing_database, refuse_read_only

    if args.compact and not args.json:
        raise UsageError("--compact needs --json")
    settings = settings_from(args, reads_demo=True)
    refuse_read_only(settings.db_url, "gpulens job-summary")
    with database_errors(database_origin(args, settings)):
        db = open_existing_database(settings.db_url)
        try:
            account = jobsummary.stored(db, args.job_id) if jobsummary.has_table(db) else None
            if account is None:
                account = jobsummary.summarise(db, args.job_id, settings.prices, now=SystemClock().now())
        finally:
            db.close()
    if account is None:
        print(f"gpulens job-summary: no job {args.job_id!r} in {db.url_redacted}", file=sys.stderr)
        return 1
    doc = account.to_json()
    if args.json:
        separators = (",", ":") if args.compact else None
        sys.stdout.write(json.dumps(doc, separators=separators, indent=None if args.compact else 2) + "\n")
    else:
        sys.stdout.write(format_account(doc))
    return 0


def _number(value: float | None, unit: str, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def format_account(doc: dict[str, Any]) -> str:
    """The summary as aligned ``name: value`` lines."""
    peak, util, idle = doc["memory_peak_bytes"], doc["utilization_mean"], doc["idle_ratio"]
    source = f" (from {doc['energy_from']})" if doc["energy_from"] else ""
    lines = [
        ("job", f"{doc['job_id']}" + (f" (user {doc['user']})" if doc["user"] else "")),
        ("state", "ended" if doc["ended"] else "running"),
        ("lifetime", f"{format_timestamp(doc['start'])} to {format_timestamp(doc['end'])}, "
         f"{format_duration(doc['end'] - doc['start'])}"),
        ("gpus", f"{doc['gpus']} on {', '.join(doc['nodes']) or '-'}"),
        ("gpu-hours", _number(doc["gpu_hours"], "", 3)),
        ("energy", _number(doc["energy_kwh"], " kWh", 3) + source),
        ("utilization", _number(None if util is None else 100 * util, "% mean", 1)),
        ("peak memory", "-" if peak is None else f"{peak / 2**30:.1f} GiB"),
        ("idle", _number(None if idle is None else 100 * idle, "% of allocated GPU time", 1)),
        ("stalled", format_duration(doc["stall_seconds"]) if doc["stall_seconds"] else "never"),
        ("cost", f"{doc['cost']:.2f} {doc['currency']}"),
        ("carbon", _number(None if doc["carbon_gco2e"] is None else doc["carbon_gco2e"] / 1000, " kg CO2e", 3)),
    ]  # fmt: skip
    width = max(len(name) for name, _ in lines)
    return "".join(f"{name + ':':<{width + 1}} {value}\n" for name, value in lines)
