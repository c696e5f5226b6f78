"""Wiring of ``gpulens collector`` and ``gpulens db upgrade``: settings in, a running collector out."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

import sqlalchemy as sa
from prometheus_client import start_http_server

from gpulens.config import ConfigError
from gpulens.settings import Settings
from storage.collector import Collector, RoundHook, RoundResult
from storage.db import Database


def _listen(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not port.isdigit():
        raise ConfigError(f"expected host:port, got {value!r}", key="collector.listen")
    return host.strip("[]") or "0.0.0.0", int(port)


def open_database(settings: Settings, *, upgrade: bool = True) -> Database:
    """Connect and bring the schema up to date (migrations run at start-up)."""
    db = Database(settings.db_url)
    if upgrade:
        try:
            db.upgrade()
        except BaseException:
            db.close()
            raise
    return db


def open_existing_database(settings: Settings) -> Database:
    """Open a store for reading, refusing to create one: a mistyped URL must not look like an empty cluster."""
    url = sa.engine.make_url(settings.db_url)
    file = url.database if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:") else None
    if file is not None and not Path(file).exists():
        raise ConfigError(f"no database at {file} (start the collector first, or give --db / --config)", key="--db")
    db = Database(settings.db_url)
    try:
        with db.translate_errors():
            present = sa.inspect(db.engine).has_table("gpu")
    except BaseException:
        db.close()
        raise
    if not present:
        db.close()
        raise ConfigError(f"{db.url_redacted} holds no gpulens data (start the collector, or run gpulens db upgrade)")
    return db


def run_collector(
    settings: Settings,
    announce: Callable[[str], None],
    *,
    hooks: Callable[[Database], Sequence[RoundHook]] | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Scrape until SIGINT/SIGTERM (or ``stop``). ``hooks`` builds the post-round hooks (the alert engine) once the
    database is open. Raises on a bad start (ConfigError, OSError, database errors)."""
    db = open_database(settings)
    try:
        round_hooks = hooks(db) if hooks is not None else ()
    except BaseException:
        db.close()
        raise
    collector = Collector(settings, db, hooks=round_hooks)
    host, port = _listen(settings.listen)
    try:
        try:
            server, thread = start_http_server(port, host, registry=collector.metrics.registry)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot listen on {settings.listen}: {exc.strerror or exc}") from None
        stop = stop or threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()

        previous = {}
        if threading.current_thread() is threading.main_thread():
            previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        shard = f", shard {settings.shard[0]}/{settings.shard[1]}" if settings.shard[1] > 1 else ""
        announce(
            f"gpulens collector writing to {db.url_redacted} every {settings.interval_s:g}s{shard}; "
            f"its metrics at http://{host}:{port}/metrics"
        )

        last: list[tuple[int, int, bool]] = []

        def on_round(result: RoundResult) -> None:
            """Report the first round and every change in targets up or database state, not every round."""
            up = sum(1 for t in result.targets if t.up)
            key = (up, len(result.targets), result.written)
            if last and last[0] == key:
                return
            last[:] = [key]
            state = "written" if result.written else "spooled (database unreachable)"
            gpus = sum(len(s.gpus) for s in result.snapshots)
            announce(f"round: {up}/{len(result.targets)} targets up, {gpus} GPUs, {result.duration_s:.2f}s, {state}")

        try:
            collector.run(stop, on_round=on_round)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
    finally:
        collector.close()
        db.close()
    return 0
