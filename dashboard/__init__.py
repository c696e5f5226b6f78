"""The gpulens web dashboard (Dash and Plotly), reading the store only through storage's read modules.

Those are ``storage.latest``, ``storage.timeseries``, ``storage.jobstats`` and ``storage.inventory``.

``dashboard.app.create_app(db)`` builds the app; ``dashboard.server.run_dashboard`` serves it.
"""
