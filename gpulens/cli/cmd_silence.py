"""``gpulens silence add|list|expire``: muting alerts for a while."""

from __future__ import annotations

import argparse
from typing import Any

from gpulens.cli.base import (
    CliError,
    Formatter,
    Parser,
    UsageError,
    add_db_flags,
    add_log_level,
    database_errors,
    database_origin,
    positive_duration,
    settings_from,
)
from gpulens.config import format_timestamp


def register(sub: Any) -> None:
    p = sub.add_parser(
        "silence",
        help="mute alerts for a while",
        description="Silences mute the notifications of matching alerts (they keep their state and stay on the "
        "dashboard). Matchers are label=value, label!=value, label=~regex or label!~regex.",
        epilog='examples:\n  gpulens silence add --match node=node-01 --duration 2h --comment "draining for repairs"\n'
        "  gpulens silence list\n  gpulens silence expire 3\n",
        formatter_class=Formatter,
    )
    ssub = p.add_subparsers(dest="silence_command", metavar="ACTION", parser_class=Parser)
    ssub.required = True
    add = ssub.add_parser("add", help="add a silence")
    add_db_flags(add)
    add.add_argument("--match", action="append", required=True, help="label matcher; repeatable (all must match)")
    add.add_argument("--duration", type=positive_duration, required=True, help="how long (30m, 2h, 1d)")
    add.add_argument("--comment", required=True, help="why (shown with the silence)")
    add.add_argument("--author", default=None, help="who (default: the login name)")
    add_log_level(add)
    add.set_defaults(func=_run_silence)
    lst = ssub.add_parser("list", help="list active silences")
    add_db_flags(lst)
    lst.add_argument("--all", action="store_true", help="include expired silences")
    lst.add_argument("--json", action="store_true", help="print one JSON array")
    add_log_level(lst)
    lst.set_defaults(func=_run_silence)
    exp = ssub.add_parser("expire", help="end a silence now")
    add_db_flags(exp)
    exp.add_argument("id", type=_silence_id, help="the silence's id (from silence list)")
    add_log_level(exp)
    exp.set_defaults(func=_run_silence)


def _silence_id(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a silence id (a number from gpulens silence list), got {text!r}")
    return int(text)


def _run_silence(args: argparse.Namespace) -> int:
    import time

    from gpulens.alerts.matchers import MatcherError, parse_matcher

    now = time.time()
    matchers: list[Any] = []
    if args.silence_command == "add":
        for text in args.match:
            try:
                matchers.append(parse_matcher(text))
            except MatcherError as exc:
                raise UsageError(f"--match {text!r}: {exc}") from None
    settings = settings_from(args)
    with database_errors(database_origin(args, settings)):
        _apply(args, settings, matchers, now)
    return 0


def _apply(args: argparse.Namespace, settings: Any, matchers: list[Any], now: float) -> None:
    import getpass
    import json

    from gpulens.cli.table import render_table
    from gpulens.storage import alertstore
    from gpulens.storage.connect import is_prometheus_url, open_database

    # Over a read-only Prometheus store, silences live in the alert engine's state store beside it.
    db = open_database(settings.state_url if is_prometheus_url(settings.db_url) else settings.db_url)
    try:
        if args.silence_command == "add":
            author = args.author or getpass.getuser()
            silence_id = alertstore.add_silence(
                db,
                matchers=[m.to_json() for m in matchers],
                starts_at=now,
                ends_at=now + args.duration,
                comment=args.comment,
                created_by=author,
                now=now,
            )
            print(f"silence {silence_id} added until {format_timestamp(now + args.duration)}")
        elif args.silence_command == "expire":
            if not alertstore.expire_silence(db, args.id, now):
                raise CliError(f"no active silence {args.id} (gpulens silence list shows the active ones)")
            print(f"silence {args.id} expired")
        else:
            rows = [
                {
                    "id": r.id,
                    "matchers": " ".join(f"{m['name']}{m['op']}{m['value']}" for m in r.matchers),
                    "starts_at": r.starts_at,
                    "ends_at": r.ends_at,
                    "created_by": r.created_by,
                    "comment": r.comment,
                }
                for r in alertstore.list_silences(db, now=now, include_expired=args.all)
            ]
            print(json.dumps(rows) if args.json else render_table(rows), end="" if not args.json else "\n")
    finally:
        db.close()
