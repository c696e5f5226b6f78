"""``gpulens db rebuild-rollups``: recompute the rollups of a time range from the raw samples, showing progress."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, TextIO

from gpulens.cli.base import (
    Formatter,
    add_db_flags,
    add_log_level,
    database_errors,
    database_origin,
    positive_duration,
    settings_from,
)

EXAMPLES = """\
examples:
  # the last day's 1-minute and 1-hour rollups and job minutes, again from the raw samples
  gpulens db rebuild-rollups --since 24h --db postgresql+psycopg://gpulens@db/gpulens
  # hour-long chunks: fewer statements; on SQLite a writer waits up to a chunk's time
  gpulens db rebuild-rollups --since 7d --chunk-minutes 60 --db sqlite:////var/lib/gpulens/gpulens.db
"""


def register(dbsub: Any) -> None:
    p = dbsub.add_parser(
        "rebuild-rollups",
        help="recompute the rollups of the last --since from the raw samples",
        description="Recomputes the 1-minute and 1-hour rollup rows and the per-job minutes of the whole hours of the "
        "last --since from the raw samples, one chunk of --chunk-minutes per transaction, with the collector's own "
        "aggregates; what retention removed is left as it is. Progress (chunks, rows, time left) goes to stderr. "
        "Safe while the collector runs: each chunk holds the rollup lock for its own transaction only.",
        epilog=EXAMPLES,
        formatter_class=Formatter,
    )
    p.add_argument("--since", type=positive_duration, default=86_400.0, help="how far back (1h, 24h, 7d)")
    p.add_argument(
        "--chunk-minutes",
        type=int,
        default=None,  # storage.rebuild.DEFAULT_CHUNK_MINUTES: not imported here, as storage needs the server extra
        help="minutes per transaction: a divisor or a multiple of 60 (default 10)",
    )
    add_db_flags(p)
    add_log_level(p)
    p.set_defaults(func=_run)


def progress_line(p: Any) -> str:
    """One line of a rebuild's progress (``storage.rebuild.Progress``)."""
    share = 100 * p.chunks_done // max(p.chunks_total, 1)
    eta = p.eta_s
    left = "" if eta is None else f", about {_clock(eta)} left"
    return f"rebuild: {p.chunks_done}/{p.chunks_total} chunks ({share}%), {p.rows:,} rows, {_clock(p.elapsed_s)}{left}"


class ProgressPrinter:
    """Renders ``Progress`` on ``out``: one line rewritten in place on a terminal, else a line every 5% and at the
    end."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._tty = out.isatty()
        self._shown = -1

    def __call__(self, p: Any) -> None:
        step = max(1, p.chunks_total // 20)
        last = p.chunks_done == p.chunks_total
        if self._tty:
            self._out.write("\r" + progress_line(p) + ("\n" if last else ""))
        elif last or p.chunks_done // step > self._shown:
            self._out.write(progress_line(p) + "\n")
            self._shown = p.chunks_done // step
        self._out.flush()


def _clock(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole // 60}m{whole % 60:02d}s" if whole >= 60 else f"{whole}s"


def _run(args: argparse.Namespace) -> int:
    from gpulens.cli.base import CliError
    from gpulens.storage.connect import open_existing_database, refuse_read_only
    from gpulens.storage.rebuild import DEFAULT_CHUNK_MINUTES, chunks, rebuild

    chunk_minutes = DEFAULT_CHUNK_MINUTES if args.chunk_minutes is None else args.chunk_minutes
    settings = settings_from(args)
    refuse_read_only(settings.db_url, "gpulens db rebuild-rollups")
    try:
        chunks(0, 0, chunk_minutes)
    except ValueError as exc:
        raise CliError(f"--chunk-minutes: {exc}") from None
    origin = database_origin(args, settings)
    with database_errors(origin):
        db = open_existing_database(settings.db_url)
    try:
        now = time.time()
        with database_errors(origin):
            rows = rebuild(db, now - args.since, now, chunk_minutes=chunk_minutes, progress=ProgressPrinter(sys.stderr))
        print(f"{db.url_redacted}: {rows:,} rollup rows rebuilt")
    finally:
        db.close()
    return 0
