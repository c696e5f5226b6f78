"""Incidents read back from the store (``storage.incidentstore``) as typed ``Incident`` values: what the dashboard,
``gpulens incidents list`` and actions that drain nodes read. A stored document that is no incident (written by a
later version, damaged) is skipped and counted, logged once."""

from __future__ import annotations

import logging

from gpulens.alerts.incidents import Incident, open_incidents
from gpulens.logutil import LogOnce
from gpulens.storage import incidentstore
from gpulens.storage.db import Database

log = logging.getLogger(__name__)
_log_once = LogOnce(log)


def _typed(docs: list[dict[str, object]]) -> list[Incident]:
    out = []
    for doc in docs:
        try:
            out.append(Incident.from_json(doc))
        except ValueError as exc:
            _log_once("bad", "a stored incident was skipped: %s (logged once)", exc)
    return out


def read_open_incidents(db: Database) -> list[Incident]:
    """The open incidents in the store, the most severe first, then the oldest."""
    incidents = _typed(incidentstore.load_incidents(db, open_only=True))
    return open_incidents({i.id: i for i in incidents})


def read_incidents(db: Database, since: float) -> list[Incident]:
    """The open incidents and those resolved since ``since``, newest first."""
    return _typed(incidentstore.load_incidents(db, since=since))
