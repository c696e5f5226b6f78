"""``gpulens db upgrade``: database maintenance."""

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


def register(sub: Any) -> None:
    p = sub.add_parser(
        "db",
        help="database maintenance",
        description="Database maintenance.",
        epilog="example:\n  gpulens db upgrade --db postgresql+psycopg://gpulens@db/gpulens\n",
        formatter_class=Formatter,
    )
    dbsub = p.add_subparsers(dest="db_command", metavar="ACTION", parser_class=Parser)
    dbsub.required = True
    up = dbsub.add_parser("upgrade", help="apply the schema migrations (also done at collector start-up)")
    add_db_flags(up)
    add_log_level(up)
    up.set_defaults(func=_run_db_upgrade)


def _run_db_upgrade(args: argparse.Namespace) -> int:
    from gpulens.storage.connect import open_database, refuse_read_only, upgrade_schema

    settings = settings_from(args)
    refuse_read_only(settings.db_url, "gpulens db upgrade")
    origin = database_origin(args, settings)
    with database_errors(origin):
        db = open_database(settings.db_url, upgrade=False)
    try:

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
