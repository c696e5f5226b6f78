"""The gpulens web dashboard (Dash and Plotly), reading the store only through ``storage.queries``.

``dashboard.app.create_app(db)`` builds the app; ``dashboard.server.run_dashboard`` serves it.
"""
