"""Running the collector: settings in, a collector scraping until told to stop, its own /metrics served."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from prometheus_client import start_http_server

from collector.loop import Collector
from gpulens.config import ConfigError
from gpulens.netaddr import parse_listen
from gpulens.rounds import RoundHook, RoundResult
from gpulens.settings import Settings
from storage.connect import open_database
from storage.db import Database


def run_collector(
    settings: Settings,
    announce: Callable[[str], None],
    stop: threading.Event,
    *,
    hooks: Callable[[Database], Sequence[RoundHook]] | None = None,
) -> int:
    """Scrape until ``stop`` is set. ``hooks`` builds the post-round hooks (the alert engine) once the database is
    open. Raises on a bad start (ConfigError, OSError, database errors)."""
    try:
        host, port = parse_listen(settings.listen)
    except ValueError as exc:
        raise ConfigError(str(exc), key="collector.listen") from None
    db = open_database(settings.db_url)
    try:
        round_hooks = hooks(db) if hooks is not None else ()
    except BaseException:
        db.close()
        raise
    collector = Collector(settings, db, hooks=round_hooks)
    try:
        try:
            server, thread = start_http_server(port, host, registry=collector.metrics.registry)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot listen on {settings.listen}: {exc.strerror or exc}") from None
        shard = f", shard {settings.shard[0]}/{settings.shard[1]}" if settings.shard[1] > 1 else ""
        announce(
            f"gpulens collector writing to {db.url_redacted} every {settings.interval_s:g}s{shard}; "
            f"its metrics at http://{host}:{port}/metrics"
        )
        try:
            collector.run(stop, on_round=RoundAnnouncer(announce))
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
    finally:
        collector.close()
        db.close()
    return 0


class RoundAnnouncer:
    """Reports the first round and every change in targets up or database state, not every round."""

    def __init__(self, announce: Callable[[str], None]) -> None:
        self._announce = announce
        self._last: tuple[int, int, bool] | None = None

    def __call__(self, result: RoundResult) -> None:
        up = sum(1 for t in result.targets if t.up)
        key = (up, len(result.targets), result.written)
        if self._last == key:
            return
        self._last = key
        state = "written" if result.written else "spooled (database unreachable)"
        gpus = sum(len(s.gpus) for s in result.snapshots)
        self._announce(f"round: {up}/{len(result.targets)} targets up, {gpus} GPUs, {result.duration_s:.2f}s, {state}")
