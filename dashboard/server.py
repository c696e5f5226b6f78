"""Running the dashboard: ``run_dashboard`` (what ``gpulens dashboard`` calls) and the basic-auth file it reads."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from waitress.server import create_server

from gpulens.clock import Clock
from gpulens.config import ConfigError
from gpulens.dashboard.alertdata import AlertReader
from gpulens.dashboard.app import create_app
from gpulens.dashboard.silenceform import SilenceWriter
from gpulens.dashboard.webserve import CompressAndCache
from gpulens.gcpause import tune_garbage_collector
from gpulens.settings import Settings
from gpulens.storage.db import Database, DatabaseAccessError, DatabaseUnavailableError
from gpulens.storage.reading import StoreReader
from gpulens.webauth import BasicAuth
from gpulens.webroles import ROLES, VIEWER, RolePolicy

log = logging.getLogger(__name__)

_BCRYPT_PREFIXES = ("$2a$", "$2b$", "$2y$")
SERVER_NAME = "gpulens-dashboard"  # the Server header


def load_basic_auth_file(path: str | Path) -> BasicAuth:
    """An htpasswd file of bcrypt hashes, one ``user:hash`` a line (``htpasswd -nbB user password`` writes one), with
    an optional role after a third colon (``user:hash:operator``; ``gpulens.webroles``).

    Blank lines and ``#`` comments are skipped. Errors name the file and line, never the hash.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the basic-auth file: {exc}", file=path) from None
    users: dict[str, bytes] = {}
    roles: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, hashed = line.partition(":")
        if not sep or not user:
            raise ConfigError("expected user:bcrypt-hash", file=path, line=number)
        if not hashed.startswith(_BCRYPT_PREFIXES):
            raise ConfigError(f"user {user!r}: expected a bcrypt hash ($2a$/$2b$/$2y$...)", file=path, line=number)
        hashed, _, role = hashed.partition(":")
        if role and role not in ROLES:
            raise ConfigError(f"user {user!r}: expected the role {' or '.join(ROLES)}", file=path, line=number)
        users[user] = hashed.encode()
        roles[user] = role or VIEWER
    if not users:
        raise ConfigError("no users in the basic-auth file", file=path)
    return BasicAuth(users, roles=roles)


def run_dashboard(
    db: str | Settings | StoreReader,
    *,
    host: str = "127.0.0.1",
    port: int = 8050,
    basic_auth_file: str | Path | None = None,
    alerts: Callable[[Database], AlertReader] | None = None,
    clock: Clock | None = None,
    announce: Callable[[str], None] | None = None,
    stop: threading.Event,
    threads: int = 8,
    alert_reader: AlertReader | None = None,
    role_header: str | None = None,
) -> int:
    """Serve the dashboard until ``stop`` is set (it stops within 5 s). ``db`` is a database URL or the loaded
    settings (the SQL store is opened here, and ``alerts`` makes the alert store's reader over it), or an open
    ``StoreReader`` (Prometheus: the caller owns it, and passes ``alert_reader`` over its alert state store).

    The server is waitress (``threads`` worker threads), with gzip and immutable caching of Dash's fingerprinted
    assets (``gpulens.dashboard.webserve``). A database that is down at start is not fatal (the pages say so until it is
    back); one that refuses us (wrong password, no such database) is.

    Call it from the main thread, or from a thread running in a copy of its context: Dash registers pages in a
    context variable that it sets when it is imported.

    ``role_header``: roles come from this header, set by the site's reverse proxy (``gpulens.webroles``), instead
    of the basic-auth file. Silences posted from the alerts page are kept in the SQL store.

    Raises ``ConfigError`` (a bad auth file), ``OSError`` (the port is taken), ``ValueError`` (a bad URL) or
    ``DatabaseAccessError``.
    """
    auth = load_basic_auth_file(basic_auth_file) if basic_auth_file is not None else None
    database: Database | None = None
    store: Database | StoreReader
    if isinstance(db, str | Settings):
        database = store = Database(db.db_url if isinstance(db, Settings) else db)
    else:
        store = db
    try:
        if database is not None:
            try:
                database.ping()
            except DatabaseAccessError:
                raise
            except DatabaseUnavailableError as exc:
                log.warning("%s; serving anyway: the pages say so until it is back", exc)
            alert_reader = alerts(database) if alerts is not None else alert_reader
        prices = db.prices if isinstance(db, Settings) else None
        roles = RolePolicy(users=auth.roles if auth else {}, header=role_header, auth=auth is not None)
        writer = silence_writer(database) if database is not None else None
        app = create_app(
            store, clock=clock, alerts=alert_reader, basic_auth=auth, prices=prices, roles=roles, silences=writer
        )
        tune_garbage_collector()  # each page builds thousands of records: collect young objects seldom (gcpause)
        wsgi = CompressAndCache(app.server.wsgi_app)
        try:
            server = create_server(wsgi, host=host, port=port, threads=threads, ident=SERVER_NAME)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        thread = threading.Thread(target=server.run, name="dashboard-http", daemon=True)
        thread.start()
        shown = f"[{host}]" if ":" in host else host
        auth_note = " (basic auth)" if auth is not None else ""
        bound = getattr(server, "effective_port", port)
        where = f"http://{shown}:{bound}/{auth_note}"
        (announce or log.info)(f"gpulens dashboard at {where}, reading {store.url_redacted}")
        try:
            stop.wait()
        finally:
            _shut_down(server, thread)
    finally:
        if database is not None:
            database.close()
    return 0


def silence_writer(database: Database) -> SilenceWriter:
    from gpulens.storage import alertstore

    def write(matchers: list[dict[str, Any]], starts: float, ends: float, comment: str, author: str) -> int:
        return alertstore.add_silence(
            database, matchers=matchers, starts_at=starts, ends_at=ends, comment=comment, created_by=author, now=starts
        )

    return write


def _shut_down(server: Any, thread: threading.Thread, timeout_s: float = 5.0) -> None:
    """Stop waitress within ``timeout_s``: let requests in progress finish (2 s at most), cancel the queued ones,
    then close the listening socket and every connection (keep-alive ones too) on the server's own loop thread, so
    its loop ends."""
    started = time.monotonic()
    server.task_dispatcher.shutdown(cancel_pending=True, timeout=min(2.0, timeout_s / 2))

    def close_everything() -> None:
        for dispatcher in list(server._map.values()):
            dispatcher.close()

    server.trigger.pull_trigger(close_everything)
    thread.join(timeout=max(0.1, timeout_s - (time.monotonic() - started)))
    if thread.is_alive():
        log.warning("the dashboard's HTTP server did not stop within %.0f s", timeout_s)
