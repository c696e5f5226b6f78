"""Incidents in the store: one row per incident (``alerts.incidents``), its verdict as a JSON document.

The engine writes the incidents that changed in a round (``save_incidents``) in one transaction, so that a restarted
or failed-over engine resumes them (``load_incidents``: the open ones and those resolved lately) and the dashboard and
``gpulens incidents list`` read them. The columns beside the document are what reads filter and order on: the state,
when it fired and when it resolved. Resolved incidents older than ``KEEP_RESOLVED_S`` are pruned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import sqlalchemy as sa

from gpulens.storage import schema
from gpulens.storage.db import Database

KEEP_RESOLVED_S: Final = 30 * 86400.0

incident: Final = schema.incident


def save_incidents(db: Database, docs: Sequence[Mapping[str, Any]], removed: Sequence[str], now: float) -> None:
    """Write the incidents that changed (``Incident.to_json`` documents) and delete ``removed`` (merged ones)."""
    if not docs and not removed:
        return
    t = incident
    ids = [str(d["id"]) for d in docs] + list(removed)
    rows = [
        {
            "id": str(d["id"]),
            "state": str(d["state"]),
            "severity": str(d.get("severity", "")),
            "fired_at": float(d["fired_at"]),
            "resolved_at": d.get("resolved_at"),
            "updated_at": now,
            "document": dict(d),
        }
        for d in docs
    ]
    with db.write_transaction() as conn:
        conn.execute(sa.delete(t).where(t.c.id.in_(ids)))
        if rows:
            conn.execute(sa.insert(t), rows)
        conn.execute(sa.delete(t).where(t.c.resolved_at < now - KEEP_RESOLVED_S))


def load_incidents(db: Database, *, since: float | None = None, open_only: bool = False) -> list[dict[str, Any]]:
    """The stored incidents (documents), newest first: the open ones, and those resolved since ``since`` unless
    ``open_only``."""
    t = incident
    query = sa.select(t.c.document).order_by(t.c.fired_at.desc(), t.c.id)
    if open_only:
        query = query.where(t.c.state == "open")
    elif since is not None:
        query = query.where(sa.or_(t.c.state == "open", t.c.resolved_at >= since))
    with db.session() as s:
        return [dict(row.document) for row in s.execute(query)]
