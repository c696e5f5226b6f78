"""``create_app``: the Dash application, thin. Pages are modules under ``dashboard/pages``; this wires them up.

Each page module has ``PATH`` (or ``PATH_TEMPLATE``), ``TITLE``, ``layout(**query)`` (built from the URL, reading no
data) and ``register(app, context)``, which adds the page's callbacks to *this* app with the database and clock
closed over. That keeps several apps in one process (tests) independent; ``dash.callback``'s global registry would
hand every callback to the first app only.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Final

import dash
from dash import ClientsideFunction, Dash, Input, Output, dcc, html
from flask import Response, request

from gpulens.clock import Clock
from gpulens.dashboard import silenceform
from gpulens.dashboard.alertdata import AlertReader
from gpulens.dashboard.components import clientside
from gpulens.dashboard.context import Context
from gpulens.dashboard.ids import SHELL_NAV, SHELL_THEME_TOGGLE
from gpulens.dashboard.pages import PAGES
from gpulens.dashboard.silenceform import SilenceWriter
from gpulens.settings import Prices
from gpulens.storage.db import Database
from gpulens.storage.reading import StoreReader
from gpulens.storage.sqlreader import reader_of
from gpulens.webauth import BasicAuth
from gpulens.webroles import RolePolicy

log = logging.getLogger(__name__)

ASSETS: Final = Path(__file__).parent / "assets"
# plotly.js's own partial bundle of the cartesian traces (npm: plotly.js-cartesian-dist-min, MIT), 1.5 MB against the
# full bundle's 4.8 MB: the browser compiles a third as much before the first chart (docs/dashboard.md, "Sizing and
# speed"). assets/plotlyearly.js loads it; every trace type the figures use is in it (tests/dashboard/
# test_plotly_bundle.py). Not linked into the page: the "vendor" folder is left out of Dash's index.
PLOTLY_BUNDLE: Final = "vendor/plotly-cartesian-4.1.1.min.js"
NAV: Final = (
    ("Incidents", "/incidents"),
    ("Overview", "/"),
    ("Jobs", "/jobs"),
    ("Interconnect", "/interconnect"),
    ("Alerts", "/alerts"),
    ("Reports", "/reports"),
    ("Remediation", "/remediation"),
)
_UNAUTHORIZED: Final = "authentication required\n"
# Dash links @babel/polyfill 7 (core-js 2) into every page, for browsers older than any that runs Dash 4's React 18.
# core-js 2 counts U+180E as white space, as Unicode did before 6.3, so it finds every current browser's
# String.prototype.trim and parseInt wrong and replaces them with slower JavaScript, which Plotly's colour parsing
# calls for every point style: about 90 ms of a ten-chart page in Chromium (docs/dashboard.md, "Sizing and speed").
# Of the polyfill, Dash's component bundles need only regenerator-runtime (their async functions are compiled to
# it), so the page loads that instead (npm: regenerator-runtime, MIT).
REGENERATOR: Final = "vendor/regenerator-runtime-0.14.1.js"
_POLYFILL: Final = re.compile(r'<script src="[^"]*/polyfill@[^"]*"></script>\s*')


def create_app(
    db: Database | StoreReader,
    *,
    clock: Clock | None = None,
    alerts: AlertReader | None = None,
    basic_auth: BasicAuth | None = None,
    stale_after_s: float = 120.0,
    title: str = "gpulens",
    prices: Prices | None = None,
    roles: RolePolicy | None = None,
    silences: SilenceWriter | None = None,
) -> Dash:
    """The dashboard over ``db`` (a SQL ``Database``, or any ``StoreReader``: Prometheus). ``clock`` says what
    "now" is (default: the store's clock); ``alerts`` reads
    the alert engine's alerts (without it the pages say that no alert store is connected).

    ``stale_after_s``: a GPU whose newest reading is older than this shows as stale (its exporter or the collector
    is down). With ``basic_auth`` every request but ``/healthz`` needs a user and password. ``prices`` (the
    config's ``[accounting]``) price a running job's summary on its page. ``roles`` says who may act (default: from
    the basic-auth file's roles, or everyone without auth); ``silences`` stores a silence posted from the alerts
    page (``dashboard.silenceform``; without it the form is answered 501).
    """
    store = reader_of(db)
    context = Context(
        db=store, clock=clock or store.clock, alerts=alerts, stale_after_s=stale_after_s, prices=prices or Prices()
    )
    app = _Dash(
        __name__,
        use_pages=True,
        pages_folder="",
        assets_folder=str(ASSETS),
        assets_path_ignore=["vendor"],
        title=title,
        update_title="",  # keep the page title while callbacks run
        serve_locally=True,
    )
    for page in PAGES:
        page.register(app, context)
    app.layout = _shell(store)
    clientside(
        app,
        ClientsideFunction("gpulens", "toggleTheme"),
        Output(SHELL_THEME_TOGGLE, "children"),
        Input(SHELL_THEME_TOGGLE, "n_clicks"),
    )
    _install_health(app)
    if basic_auth is not None:
        _install_basic_auth(app, basic_auth)
    if roles is None:
        roles = RolePolicy(users=basic_auth.roles if basic_auth else {}, auth=basic_auth is not None)
    silenceform.install(app, write=silences, policy=roles, auth=basic_auth, clock=context.clock)
    return app


class _Dash(Dash):
    def interpolate_index(  # Dash's documented hook for the page's HTML; its own signature, unannotated
        self,
        metas: Any = "",
        title: Any = "",
        css: Any = "",
        config: Any = "",
        scripts: Any = "",
        app_entry: Any = "",
        favicon: Any = "",
        renderer: Any = "",
    ) -> Any:
        """The page as Dash writes it, with regenerator-runtime in place of the polyfill (see ``REGENERATOR``)."""
        runtime = f'<script src="{self.get_asset_url(REGENERATOR)}"></script>\n'
        scripts = _POLYFILL.sub(lambda _: runtime, str(scripts), count=1)
        return super().interpolate_index(  # type: ignore[no-untyped-call]
            metas, title, css, config, scripts, app_entry, favicon, renderer
        )


def _shell(store: StoreReader) -> html.Div:
    return html.Div(
        [
            html.Header(
                className="gl-topbar",
                children=[
                    dcc.Link(html.Span(["gpu", html.Span("lens")]), href="/", className="gl-brand"),
                    html.Nav(
                        id=SHELL_NAV, className="gl-nav", children=[dcc.Link(text, href=path) for text, path in NAV]
                    ),
                    html.Span(store.url_redacted, className="gl-hint mono", title="the store this dashboard reads"),
                    html.Button("Theme", id=SHELL_THEME_TOGGLE, className="gl-theme-toggle", n_clicks=0),
                ],
            ),
            html.Main(dash.page_container, className="gl-page"),
        ]
    )


def _install_health(app: Dash) -> None:
    def healthz() -> Response:
        return Response("ok\n", mimetype="text/plain")

    app.server.add_url_rule("/healthz", "gpulens_healthz", healthz)


def _install_basic_auth(app: Dash, auth: BasicAuth) -> None:
    def require_auth() -> Response | None:
        if request.path == "/healthz":
            return None
        if auth.check(request.headers.get("Authorization")) is not None:
            return None
        return Response(
            _UNAUTHORIZED, status=401, mimetype="text/plain", headers={"WWW-Authenticate": 'Basic realm="gpulens"'}
        )

    app.server.before_request(require_auth)
