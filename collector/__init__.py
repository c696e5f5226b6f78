"""The collector: scrape every target on a schedule and hand each round to storage and to the round hooks.

``loop`` (the schedule, the writer thread, the spool), ``scrape`` (one target: fetch, parse, sanitize), ``targets``
(static, file_sd, shards), ``spool`` (rounds that wait while the database is down) and ``runner`` (settings in, a
running collector out). It imports only the core and storage; the alert engine is handed in as a hook.
"""

from gpulens.extras import require_server

require_server("gpulens.collector", "apscheduler", "pycurl", "sqlalchemy")
