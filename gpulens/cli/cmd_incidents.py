"""``gpulens incidents list``: the incidents the alert engine formed (docs/incidents.md), from the store."""

from __future__ import annotations

import argparse
from typing import Any

from gpulens.cli.base import (
    Formatter,
    Parser,
    add_db_flags,
    add_log_level,
    database_errors,
    database_origin,
    positive_duration,
    settings_from,
)

LIST_EXAMPLES = """\
examples:
  gpulens incidents list --db sqlite:////var/lib/gpulens/gpulens.db
  gpulens incidents list --config .gpulens-demo/gpulens.toml --json | jq '.[].culprit'
  gpulens incidents list --db prometheus+http://prometheus:9090 --state-db sqlite:////var/lib/gpulens/alerts.db
  gpulens incidents list --since 24h        # with those resolved in the last 24 hours
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "incidents",
        help="the incidents: one verdict per fault (culprit, jobs hurt, action)",
        description="Incidents: the alert engine's firing alerts grouped by cause, one per fault.",
        epilog=LIST_EXAMPLES,
        formatter_class=Formatter,
    )
    isub = p.add_subparsers(dest="incidents_command", metavar="ACTION", parser_class=Parser)
    isub.required = True
    lst = isub.add_parser(
        "list",
        help="the open incidents (and those resolved lately, with --since)",
        description="The incidents open now, from the store the alert engine writes: the SQL store of the "
        "collectors (or of alerts run), or with a Prometheus --db the alert state store beside it (--state-db, "
        "[database] state_url). Each names its culprit (a GPU, a port, a rank, a node or a job), the jobs and users "
        "it hurts, its action and its member alerts. The most severe first, then the oldest.",
        epilog=LIST_EXAMPLES,
        formatter_class=Formatter,
    )
    add_db_flags(lst)
    lst.add_argument("--state-db", default=None, help="alert state store beside a Prometheus --db (SQL URL)")
    lst.add_argument("--since", type=positive_duration, default=None, help="also the incidents resolved this recently")
    lst.add_argument("--json", action="store_true", help="print one JSON array of incidents")
    add_log_level(lst)
    lst.set_defaults(func=_run_list)


def _run_list(args: argparse.Namespace) -> int:
    import json
    import time

    from gpulens.alerts.incidentread import read_incidents, read_open_incidents
    from gpulens.cli.table import render_table
    from gpulens.storage.connect import is_prometheus_url, open_existing_database

    settings = settings_from(args)
    url = args.state_db or (settings.state_url if is_prometheus_url(settings.db_url) else settings.db_url)
    origin = "--state-db" if args.state_db else database_origin(args, settings)
    now = time.time()
    with database_errors(origin):
        db = open_existing_database(url)
        try:
            incidents = read_open_incidents(db) if args.since is None else read_incidents(db, now - args.since)
        finally:
            db.close()
    if args.json:
        print(json.dumps([i.to_json() for i in incidents]))
    else:
        print(render_table([_row(i, now) for i in incidents], _COLUMNS), end="")
    return 0


_COLUMNS = ("id", "state", "severity", "culprit", "jobs", "users", "action", "age", "alerts")


def _row(inc: Any, now: float) -> dict[str, Any]:
    from gpulens.config import format_duration

    end = inc.resolved_at if inc.resolved_at is not None else now
    return {
        "id": inc.id,
        "state": inc.state,
        "severity": inc.severity,
        "culprit": inc.culprit.text,
        "jobs": ",".join(inc.jobs) or None,
        "users": ",".join(inc.users) or None,
        "action": inc.action,
        "age": format_duration(max(0.0, end - inc.started_at)),
        "alerts": ",".join(sorted({m.rule for m in inc.members})),
    }
