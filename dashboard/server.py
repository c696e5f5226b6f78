"""Running the dashboard: ``run_dashboard`` (what ``gpulens dashboard`` calls) and the basic-auth file it reads."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from werkzeug.serving import make_server

from dashboard.alertdata import AlertReader
from dashboard.app import create_app
from gpulens.clock import Clock
from gpulens.config import ConfigError
from gpulens.settings import Settings
from gpulens.webauth import BasicAuth
from storage.db import Database

log = logging.getLogger(__name__)

_BCRYPT_PREFIXES = ("$2a$", "$2b$", "$2y$")


def load_basic_auth_file(path: str | Path) -> BasicAuth:
    """An htpasswd file of bcrypt hashes, one ``user:hash`` a line (``htpasswd -nbB user password`` writes one).

    Blank lines and ``#`` comments are skipped. Errors name the file and line, never the hash.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the basic-auth file: {exc}", file=path) from None
    users: dict[str, bytes] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, hashed = line.partition(":")
        if not sep or not user:
            raise ConfigError("expected user:bcrypt-hash", file=path, line=number)
        if not hashed.startswith(_BCRYPT_PREFIXES):
            raise ConfigError(f"user {user!r}: expected a bcrypt hash ($2a$/$2b$/$2y$...)", file=path, line=number)
        users[user] = hashed.encode()
    if not users:
        raise ConfigError("no users in the basic-auth file", file=path)
    return BasicAuth(users)


def run_dashboard(
    db: str | Settings,
    *,
    host: str = "127.0.0.1",
    port: int = 8050,
    basic_auth_file: str | Path | None = None,
    alerts: Callable[[Database], AlertReader] | None = None,
    clock: Clock | None = None,
    announce: Callable[[str], None] | None = None,
    stop: threading.Event,
) -> int:
    """Serve the dashboard until ``stop`` is set. ``db`` is a database URL or the loaded settings;
    ``alerts`` makes the alert store's reader over the opened database.

    Call it from the main thread, or from a thread running in a copy of its context: Dash registers pages in a
    context variable that it sets when it is imported.

    Raises ``ConfigError`` (a bad auth file), ``OSError`` (the port is taken) or ``ValueError`` (a bad URL).
    """
    url = db.db_url if isinstance(db, Settings) else db
    auth = load_basic_auth_file(basic_auth_file) if basic_auth_file is not None else None
    database = Database(url)
    try:
        reader = alerts(database) if alerts is not None else None
        app = create_app(database, clock=clock, alerts=reader, basic_auth=auth)
        try:
            server = make_server(host, port, app.server, threaded=True)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        thread = threading.Thread(target=server.serve_forever, name="dashboard-http", daemon=True)
        thread.start()
        shown = f"[{host}]" if ":" in host else host
        auth_note = " (basic auth)" if auth is not None else ""
        (announce or log.info)(
            f"gpulens dashboard at http://{shown}:{server.server_port}/{auth_note}, reading {database.url_redacted}"
        )
        try:
            stop.wait()
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
    finally:
        database.close()
    return 0
