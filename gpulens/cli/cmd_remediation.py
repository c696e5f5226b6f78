"""``gpulens remediation list|resume``: what the remediation actions did, and lifting the brake's halt."""

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
    settings_from,
)
from gpulens.config import format_timestamp


def register(sub: Any) -> None:
    p = sub.add_parser(
        "remediation",
        help="what the remediation actions did; lift the brake's halt",
        description="The [[alerts.actions]] (slurm-drain, command) keep every decision in the store: what was done, "
        "what a dry run would have done, what was refused and why, the nodes held drained with the incidents or "
        "alerts that hold them, and the brake. When the brake halts remediation (GpulensRemediationHalted), "
        "nothing is drained until a person lifts it with resume.",
        epilog="examples:\n  gpulens remediation list\n  gpulens remediation list --json --limit 500\n"
        "  gpulens remediation resume --author alice\n",
        formatter_class=Formatter,
    )
    rsub = p.add_subparsers(dest="remediation_command", metavar="ACTION", parser_class=Parser)
    rsub.required = True
    lst = rsub.add_parser("list", help="the brake, the nodes held and the newest decisions")
    add_db_flags(lst)
    lst.add_argument("--json", action="store_true", help="print one JSON object (halt, held, decisions)")
    lst.add_argument("--limit", type=_count, default=50, help="how many decisions, newest first (default 50)")
    add_log_level(lst)
    lst.set_defaults(func=_run)
    res = rsub.add_parser("resume", help="lift the brake's halt: remediation acts again")
    add_db_flags(res)
    res.add_argument("--author", default=None, help="who lifts it (default: the login name), kept in the store")
    add_log_level(res)
    res.set_defaults(func=_run)


def _count(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) <= 100_000:
        raise argparse.ArgumentTypeError(f"expected a number of decisions from 1 to 100000, got {text!r}")
    return int(text)


def _run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    with database_errors(database_origin(args, settings)):
        _apply(args, settings)
    return 0


def _apply(args: argparse.Namespace, settings: Any) -> None:
    import getpass
    import json
    import time

    from gpulens.cli.table import render_table
    from gpulens.storage import remediationstore
    from gpulens.storage.connect import is_prometheus_url, open_database
    from gpulens.storage.slurmtables import recent_drain_actions

    # Over a read-only Prometheus store, remediation's state lives in the alert engine's state store beside it.
    db = open_database(settings.state_url if is_prometheus_url(settings.db_url) else settings.db_url)
    try:
        if args.remediation_command == "resume":
            lifted = remediationstore.lift_halt(db, time.time(), args.author or getpass.getuser())
            if lifted is None:
                print("remediation is not halted: nothing to lift")
            else:
                print(f"remediation resumed (halted since {format_timestamp(lifted.halted_at)}: {lifted.reason})")
            return
        state = remediationstore.remediation_state(db)
        decisions = recent_drain_actions(db, args.limit)
        if args.json:
            print(json.dumps({**state, "decisions": decisions}))
            return
        halt = state["halt"]
        if halt is None:
            print("brake: not halted")
        else:
            print(f"brake: HALTED since {format_timestamp(halt['halted_at'])}: {halt['reason']}")
            print("  lift it with: gpulens remediation resume")
        held = [
            {
                "node": h["node"],
                "since": format_timestamp(h["drained_at"]),
                "dry_run": h["dry_run"],
                "causes": " ".join(c["cause"] for c in h["causes"]) or "-",
                "reason": h["reason"],
            }
            for h in state["held"]
        ]
        print(f"\nnodes held by gpulens ({len(held)}):")
        print(render_table(held), end="")
        rows = [
            {
                "time": format_timestamp(d["time"]),
                "action": d["action"],
                "step": d["step"] or "drain",
                "node": d["node"],
                "outcome": d["outcome"],
                "causes": d["causes"] or "",
                "reason": d["reason"],
            }
            for d in decisions
        ]
        print(f"\ndecisions (newest first, {len(rows)}):")
        print(render_table(rows), end="")
    finally:
        db.close()
