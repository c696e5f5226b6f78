"""Running the collector: settings in, a collector scraping until told to stop, its own /metrics served."""

from __future__ import annotations

import logging
import resource
import threading
from collections.abc import Callable, Sequence
from http import HTTPStatus
from typing import Final

from prometheus_client import generate_latest

from gpulens.collector.loop import Collector
from gpulens.config import ConfigError
from gpulens.gcpause import tune_garbage_collector
from gpulens.httpserver import TEXT, HttpServer, Request, Response
from gpulens.netaddr import parse_listen
from gpulens.rounds import RoundHook, RoundResult
from gpulens.settings import Settings
from gpulens.storage.connect import open_database_when_reachable
from gpulens.storage.db import Database
from gpulens.webconfig import WebConfig, load_web_config

log = logging.getLogger(__name__)

# Descriptors a collector holds besides its targets' connections: the database, the spool, its /metrics server and
# the alert engine's receivers (a margin, not a count).
FILES_BESIDES_TARGETS = 256
_MOST_FILES = 1 << 20  # the soft limit asked for when the hard limit is unlimited


def raise_open_files_limit(targets: int) -> tuple[int, int]:
    """Raise the soft open-file limit to the hard one, as Go servers such as Prometheus do at start: the collector
    keeps one connection open per target between rounds, and a soft limit of 1,024 (systemd's default) would fail
    the connects of a 1,000-target shard with "Too many open files". Logs once when even the hard limit is below
    ``targets`` + ``FILES_BESIDES_TARGETS``. Returns the (soft, hard) limits now in force."""
    unlimited = resource.RLIM_INFINITY
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = _MOST_FILES if hard == unlimited else hard
    if soft != unlimited and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %d: %s", soft, exc)
    needed = targets + FILES_BESIDES_TARGETS
    if soft != unlimited and soft < needed:
        log.warning(
            "the open-file limit (%d) is below the %d descriptors %d targets need (one kept-alive connection each): "
            "raise the hard limit (systemd: LimitNOFILE=, a container: --ulimit nofile=)",
            soft,
            needed,
            targets,
        )
    return soft, hard


def run_collector(
    settings: Settings,
    announce: Callable[[str], None],
    stop: threading.Event,
    *,
    hooks: Callable[[Database], Sequence[RoundHook]] | None = None,
    migrate: bool = False,
) -> int:
    """Scrape until ``stop`` is set. ``hooks`` builds the post-round hooks (the alert engine) once the database is
    open; a hook with a ``close()`` method is closed when the collector stops.

    A database that is down at start-up does not stop the collector: rounds are spooled and the schema is checked
    once it is back. An older schema is migrated only with ``migrate`` (``--migrate``); otherwise start-up stops
    with one line that says what to run (``SchemaBehindError``). Raises on a bad start (ConfigError, OSError,
    DatabaseAccessError: a wrong password, an unknown role or a missing database)."""
    try:
        host, port = parse_listen(settings.listen)
    except ValueError as exc:
        raise ConfigError(str(exc), key="collector.listen") from None
    web = load_web_config(settings.web_config) if settings.web_config else WebConfig()
    db, schema_ready = open_database_when_reachable(settings.db_url, migrate=migrate)
    try:
        round_hooks = list(hooks(db)) if hooks is not None else []
    except BaseException:
        db.close()
        raise
    collector = Collector(settings, db, hooks=round_hooks, schema_ready=schema_ready, migrate=migrate)
    raise_open_files_limit(collector.target_count())
    tune_garbage_collector()
    try:
        server = serve_metrics(collector, settings, web)
        shard = f", shard {settings.shard[0]}/{settings.shard[1]}" if settings.shard[1] > 1 else ""
        announce(
            f"gpulens collector writing to {db.url_redacted} every {settings.interval_s:g}s{shard}; "
            f"its metrics at {server.scheme}://{host}:{port}/metrics"
            + (" (basic auth)" if web.basic_auth is not None else "")
        )
        try:
            collector.run(stop, on_round=RoundAnnouncer(announce))
        finally:
            server.close()
    finally:
        close_hooks(round_hooks)  # the notification worker stops before the lock goes to the standby
        collector.close()
        db.close()
    return 0


METRICS_CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
METRICS_WORKERS: Final = 4  # threads answering the collector's /metrics: one Prometheus or two, and a curl
METRICS_READ_TIMEOUT_S: Final = 10.0


def metrics_page(render: Callable[[], bytes], title: str) -> Callable[[Request], Response]:
    """``render()`` at ``/metrics`` (rendered per request: the collector's registry, a few kilobytes), a link to it at
    ``/``, 404 elsewhere."""

    def answer(request: Request) -> Response:
        path = request.path.rstrip("/") or "/"
        if path == "/metrics":
            return Response(HTTPStatus.OK, render(), METRICS_CONTENT_TYPE)
        if path == "/":
            body = f'<!doctype html><title>{title}</title><a href="metrics">metrics</a>\n'
            return Response(HTTPStatus.OK, body.encode(), "text/html; charset=utf-8")
        return Response(HTTPStatus.NOT_FOUND, b"not found; see /metrics\n", TEXT)

    return answer


def serve_metrics(collector: Collector, settings: Settings, web: WebConfig) -> HttpServer:
    """The collector's own /metrics on ``settings.listen``, with the web config's TLS and basic auth, started."""
    host, port = parse_listen(settings.listen)
    registry = collector.metrics.registry
    try:
        server = HttpServer(
            metrics_page(lambda: generate_latest(registry), "gpulens collector"),
            host=host,
            port=port,
            web=web,
            name="gpulens-metrics",
            version="BaseHTTP/0.6",  # the Server header this endpoint has always sent
            cache_control=None,
            workers=METRICS_WORKERS,
            read_timeout_s=METRICS_READ_TIMEOUT_S,
        )
    except OSError as exc:
        raise OSError(exc.errno, f"cannot listen on {settings.listen}: {exc.strerror or exc}") from None
    server.start()
    return server


def close_hooks(hooks: Sequence[RoundHook]) -> None:
    for hook in hooks:
        close = getattr(hook, "close", None)
        if callable(close):
            try:
                close()
            except Exception:
                log.exception("closing a post-round hook failed")


class RoundAnnouncer:
    """Reports the first round and every change in targets up or database state, not every round."""

    def __init__(self, announce: Callable[[str], None]) -> None:
        self._announce = announce
        self._last: tuple[int, int, bool] | None = None

    def __call__(self, result: RoundResult) -> None:
        if not result.leading:  # a standby (collector.pair logs the change); its first active round is reported
            self._last = None
            return
        up = sum(1 for t in result.targets if t.up)
        key = (up, len(result.targets), result.written)
        if self._last == key:
            return
        self._last = key
        state = "written" if result.written else "spooled (database unreachable)"
        gpus = sum(len(s.gpus) for s in result.snapshots)
        self._announce(f"round: {up}/{len(result.targets)} targets up, {gpus} GPUs, {result.duration_s:.2f}s, {state}")
