"""``gpulens simulate``: a scenario in virtual time, and the alerts that fired."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gpulens.cli.base import Formatter, add_log_level, database_errors
from gpulens.cli.envtwins import apply_env_twins

SIMULATE_EXAMPLES = """\
examples:
  gpulens simulate examples/scenarios/stall.toml
  gpulens simulate examples/scenarios/faults.toml --json | jq '.[].alertname'
  gpulens simulate examples/scenarios/faults.toml --incidents-json | jq '.[].culprit'
  gpulens simulate my-cluster.toml --rules my-rules.toml       # test your own rules, like promtool test rules
  gpulens simulate examples/scenarios/demo.toml --db sqlite:///demo.db   # keep the data for the dashboard
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "simulate",
        help="run a scenario in virtual time and report the alerts that fired",
        description="Runs a scenario file (docs/scenarios.md) in virtual time through the production source, ingest, "
        "storage and alert-rule code, as fast as the CPU allows, and reports the alerts that fired. Times are the "
        "scenario's virtual time.",
        epilog=SIMULATE_EXAMPLES,
        formatter_class=Formatter,
    )
    p.add_argument("scenario", help="scenario TOML")
    p.add_argument("--db", default=None, help="keep the data in this database (default: a temporary SQLite file)")
    p.add_argument("--rules", default=None, help="a file of [[rules]] tables: user rules to test with the builtins")
    output = p.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print one JSON array of the alerts that fired")
    output.add_argument(
        "--incidents-json",
        action="store_true",
        help="print one JSON array of the incidents (docs/incidents.md): each one's culprit, jobs, member alerts "
        "and action",
    )
    add_log_level(p)
    apply_env_twins(p, "GPULENS_SIMULATE_")
    p.set_defaults(func=_run_simulate)


def _run_simulate(args: argparse.Namespace) -> int:
    import json

    from gpulens.cli.simulation import simulate
    from gpulens.storage.connect import refuse_read_only

    if args.db:
        refuse_read_only(args.db, "gpulens simulate")
    with database_errors("--db" if args.db else None):
        report = simulate(
            args.scenario,
            db_url=args.db,
            rules_path=args.rules,
            progress=None
            if args.json or args.incidents_json
            else (lambda line: print(line, file=sys.stderr, flush=True)),
        )
    if args.json:
        print(json.dumps(report.alerts, indent=2))
    elif args.incidents_json:
        print(json.dumps(report.incidents, indent=2))
    else:
        print(report.table)
        print(
            f"\n{len(report.alerts)} alerts; {report.rounds} rounds of {report.gpus} GPUs in {report.seconds:.1f}s",
            file=sys.stderr,
        )
    return 0
