"""The gpulens web dashboard (Dash and Plotly), reading the store only through storage's read modules.

Those are ``storage.latest``, ``storage.timeseries``, ``gpulens.storage.jobstats`` and ``gpulens.storage.inventory``.

``gpulens.dashboard.app.create_app(db)`` builds the app; ``gpulens.dashboard.server.run_dashboard`` serves it.
"""

from gpulens.extras import require_server

require_server("gpulens.dashboard", "dash", "plotly", "waitress", "sqlalchemy")
