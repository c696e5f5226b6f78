"""``gpulens db upgrade [--plan]``: database maintenance: plan the schema upgrade, then apply it (and ``gpulens db
rebuild-rollups``: ``cmd_db_rebuild``)."""

from __future__ import annotations

import argparse
from typing import Any

from gpulens.cli import cmd_db_rebuild
from gpulens.cli.base import (
    CliError,
    Formatter,
    Parser,
    add_db_flags,
    add_log_level,
    database_errors,
    database_origin,
    settings_from,
)

DB_EXAMPLES = """\
examples:
  # what the upgrade will do on this database, and how long it will hold which lock (changes nothing)
  gpulens db upgrade --plan --db postgresql+psycopg://gpulens@db/gpulens
  # then, with the collector stopped and a backup taken (docs/upgrades.md)
  gpulens db upgrade --db postgresql+psycopg://gpulens@db/gpulens
  # the last day's rollups again from the raw samples, with progress on stderr
  gpulens db rebuild-rollups --since 24h --db postgresql+psycopg://gpulens@db/gpulens
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "db",
        help="database maintenance",
        description="Database maintenance.",
        epilog=DB_EXAMPLES,
        formatter_class=Formatter,
    )
    dbsub = p.add_subparsers(dest="db_command", metavar="ACTION", parser_class=Parser)
    dbsub.required = True
    up = dbsub.add_parser(
        "upgrade",
        help="apply the schema migrations (the collector does so at start-up only with --migrate)",
        description="Brings the database's schema to this gpulens's newest revision. --plan only prints each pending "
        "migration, what it changes, the rows of the tables it touches, whether it copies them, the lock it holds, "
        "an estimate of its time, and whether it can be undone.",
        epilog=DB_EXAMPLES,
        formatter_class=Formatter,
    )
    add_db_flags(up)
    up.add_argument("--plan", action="store_true", help="print what the upgrade would do; change nothing")
    add_log_level(up)
    up.set_defaults(func=_run_db_upgrade)
    down = dbsub.add_parser(
        "downgrade",
        help="undo the migrations after a revision (a rollback; back up first)",
        description="Takes the schema back to --to REVISION by running each newer migration's downgrade, for the "
        "previous gpulens's wheel to run on. What a migration added (tables, columns) is dropped with its data; "
        "gpulens db upgrade --plan says which do. The safe rollback is the backup taken before the upgrade "
        "(docs/upgrades.md).",
        epilog="example:\n  gpulens db downgrade --to 0016 --db sqlite:////var/lib/gpulens/gpulens.db\n",
        formatter_class=Formatter,
    )
    down.add_argument("--to", required=True, metavar="REVISION", help="the revision to go back to (e.g. 0016)")
    add_db_flags(down)
    add_log_level(down)
    down.set_defaults(func=_run_db_downgrade)
    cmd_db_rebuild.register(dbsub)


def _run_db_upgrade(args: argparse.Namespace) -> int:
    from gpulens.storage.connect import open_database, refuse_read_only, upgrade_schema

    settings = settings_from(args)
    refuse_read_only(settings.db_url, "gpulens db upgrade")
    origin = database_origin(args, settings)
    with database_errors(origin):
        db = open_database(settings.db_url, upgrade=False)
    try:
        if args.plan:
            with database_errors(origin):
                print("\n".join(plan_lines(db)))
            return 0

        def announce(current: str | None, newest: str) -> None:
            print(
                f"{db.url_redacted}: upgrading the schema from revision {current or '(none)'} to {newest}; "
                "a revision that copies the sample tables takes about as long as writing them",
                flush=True,
            )

        with database_errors(origin):
            upgrade_schema(db, announce)
        print(f"{db.url_redacted}: schema up to date (revision {db.head_revision()})")
    finally:
        db.close()
    return 0


def _run_db_downgrade(args: argparse.Namespace) -> int:
    from gpulens.storage.connect import is_known_revision, open_database, refuse_read_only

    settings = settings_from(args)
    refuse_read_only(settings.db_url, "gpulens db downgrade")
    if not is_known_revision(args.to):
        raise CliError(f"--to {args.to!r}: not a revision of this gpulens (gpulens db upgrade --plan lists them)")
    origin = database_origin(args, settings)
    with database_errors(origin):
        db = open_database(settings.db_url, upgrade=False)
    try:
        with database_errors(origin):
            current = db.schema_revision()
            db.downgrade(args.to)
        print(f"{db.url_redacted}: schema taken from revision {current or '(none)'} back to {args.to}")
    finally:
        db.close()
    return 0


def plan_lines(db: Any) -> list[str]:
    """``gpulens db upgrade --plan``'s text: a line for the database, a paragraph per pending migration, a total."""
    from gpulens.storage.upgradeplan import plan

    current, newest = db.schema_revision(), db.head_revision()
    steps = plan(db)
    if not steps:
        return [f"{db.url_redacted}: schema up to date (revision {newest}); nothing to do"]
    lines = [
        f"{db.url_redacted}: at revision {current or '(none: an empty database)'}; "
        f"{len(steps)} migration{'s' if len(steps) != 1 else ''} to {newest}, oldest first"
    ]
    for step in steps:
        touched = ", ".join(f"{t} {n:,} rows" for t, n in sorted(step.tables.items())) or "no existing table"
        undo = "no" if not step.reversible else "yes, dropping what it added" if step.downgrade_drops else "yes"
        lines += [
            f"{step.revision}  {step.changes}",
            f"      touches: {touched}",
            f"      copies: {step.rows_copied:,} rows, {_duration(step.seconds(db.dialect))}; "
            f"lock: {step.lock(db.dialect)}",
            f"      reversible: {undo}",
        ]
    total = sum(step.seconds(db.dialect) for step in steps)
    rows = sum(step.rows_copied for step in steps)
    lines.append(
        f"total: {rows:,} rows copied, {_duration(total)}; stop the collector and back up first "
        "(docs/upgrades.md), then run gpulens db upgrade"
    )
    return lines


def _duration(seconds: float) -> str:
    if seconds < 1:
        return "under a second"
    if seconds < 120:
        return f"about {seconds:.0f} s"
    if seconds < 7200:
        return f"about {seconds / 60:.0f} min"
    return f"about {seconds / 3600:.1f} h"
