"""``gpulens query``: the stored history from the command line."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gpulens.cli.base import (
    Formatter,
    Parser,
    UsageError,
    add_db_flags,
    add_log_level,
    database_errors,
    database_origin,
    positive_duration,
    positive_int,
    settings_from,
)

QUERY_EXAMPLES = """\
examples:
  gpulens query latest                               # the latest reading of every GPU
  gpulens query latest --json | jq '.[] | select(.utilization_ratio < 0.1)'
  gpulens query series --gpu GPU-1234 --field utilization_ratio --field power_watts --since 1h
  gpulens query jobs --since 24h
  gpulens query nics                                 # every RDMA port: state, rate, traffic, GPUs, errors
  gpulens query nics --node node-03 --json | jq '.[] | select(.up | not)'
  gpulens query targets --config gpulens.toml
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "query",
        help="read the stored history from the command line",
        description="Reads the store: a readable table, or with --json one JSON array whose field names are the "
        "exporter's catalogue names (memory_used_bytes, utilization_ratio, node, uuid, job_id, ...).",
        epilog=QUERY_EXAMPLES,
        formatter_class=Formatter,
    )
    qsub = p.add_subparsers(dest="what", metavar="WHAT", parser_class=Parser)
    qsub.required = True
    for name, help_text in (
        ("latest", "the latest reading of every GPU"),
        ("series", "one or more fields of one or more GPUs over time"),
        ("jobs", "per-job aggregates"),
        ("targets", "the health of every scrape target"),
        ("nics", "every RDMA port (InfiniBand or RoCE): state, rate, traffic against its rate, GPUs, errors"),
    ):
        q = qsub.add_parser(name, help=help_text, epilog=QUERY_EXAMPLES, formatter_class=Formatter)
        add_db_flags(q)
        q.add_argument("--json", action="store_true", help="print one JSON array")
        if name in ("series", "jobs"):
            q.add_argument("--since", type=positive_duration, default=3600.0, help="how far back (1h, 24h, 7d)")
        if name == "series":
            q.add_argument("--gpu", action="append", required=True, help="GPU UUID; repeatable")
            q.add_argument("--field", action="append", required=True, help="field name; repeatable")
            q.add_argument("--points", type=positive_int, default=100, help="at most this many points per series")
        if name == "nics":
            q.add_argument("--node", help="only this node's ports")
        add_log_level(q)
        q.set_defaults(func=_run_query)


def _run_query(args: argparse.Namespace) -> int:
    from gpulens.cli.query_print import run_query
    from gpulens.storage.connect import open_reader

    if args.what == "series":
        _check_fields(args.field)
    settings = settings_from(args, reads_demo=True)
    with database_errors(database_origin(args, settings)):
        store = open_reader(settings.db_url, settings)
        try:
            text = run_query(store, args)
        finally:
            store.close()
    sys.stdout.write(text)
    return 0


def _check_fields(fields: list[str]) -> None:
    from gpulens.storage.schema import FIELD_BY_NAME

    unknown = [f for f in fields if f not in FIELD_BY_NAME]
    if unknown:
        shown = ", ".join(repr(f) for f in unknown)
        raise UsageError(f"--field {shown}: unknown field (expected one of {', '.join(FIELD_BY_NAME)})")
