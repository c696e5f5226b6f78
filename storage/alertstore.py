"""SQL persistence of the alert engine: states, history, notification groups, the outbox and silences.

Storage sits below the alerts package, so everything here speaks plain JSON objects (the alerts package's
``to_json``/``from_json`` shapes) and plain rows; ``alerts.persist`` adapts them to the engine's types.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import sqlalchemy as sa

from gpulens.storage import schema
from gpulens.storage.db import Database


@dataclass(frozen=True)
class OutboxRow:
    id: int
    receiver: str
    payload: Mapping[str, Any]
    attempts: int
    created_at: float
    next_attempt_at: float
    status: str
    last_error: str | None


@dataclass(frozen=True)
class SilenceRow:
    id: int
    matchers: Any
    starts_at: float
    ends_at: float
    comment: str
    created_by: str
    created_at: float


@dataclass(frozen=True)
class AlertRow:
    """An alert as the dashboard shows it."""

    fingerprint: str
    rule: str
    state: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    value: float | None
    active_at: float
    fired_at: float | None
    resolved_at: float | None
    last_eval_at: float


@dataclass(frozen=True)
class AlertEvent:
    fingerprint: str
    rule: str
    state: str
    labels: Mapping[str, str]
    value: float | None
    at: float
    began_at: float | None = None  # when the fault began, where known before the alert's condition held


# A stored history event's labels carry its ``began_at`` under this reserved name (Prometheus reserves ``__``), read
# back into ``AlertEvent.began_at`` and never shown as a label.
BEGAN_LABEL: Final = "__began_at__"


# --- engine state ---------------------------------------------------------------------------------------------------


def load_alert_states(db: Database) -> list[dict[str, Any]]:
    """Every stored alert state as the JSON object it was saved from. A row written before revision 0002 has no
    document: it is read from its columns, so an alert firing before the upgrade keeps its fingerprint and its
    state after it (the engine resumes it instead of firing and notifying it again)."""
    with db.session() as s:
        return [_state_document(row) for row in s.execute(sa.select(schema.alert_state))]


def _state_document(row: Any) -> dict[str, Any]:
    if row.document is not None:
        return dict(row.document)
    return {
        "fingerprint": row.fingerprint,
        "rule": row.rule,
        "labels": dict(row.labels),
        "annotations": dict(row.annotations),
        "state": row.state,
        "active_since": row.active_at,
        "fired_at": row.fired_at,
        "resolved_at": row.resolved_at,
        "last_seen": row.last_eval_at,
        "value": row.value,
        "muted": row.muted,
    }


def load_alert_groups(db: Database) -> dict[str, dict[str, Any]]:
    g = schema.alert_group
    with db.session() as s:
        return {row.key: dict(row.state) for row in s.execute(sa.select(g.c.key, g.c.state))}


def save_alert_round(
    db: Database,
    *,
    states: Sequence[Mapping[str, Any]],
    removed: Sequence[str],
    transitions: Sequence[Mapping[str, Any]],
    groups: Mapping[str, Mapping[str, Any]],
    now: float,
) -> None:
    """Store one engine round in one transaction: the states as they are now, the history of what changed, and the
    notification groups. ``states`` are AlertState JSON objects; ``transitions`` hold fingerprint, rule, state,
    labels, value and optionally began_at."""
    t, h, g = schema.alert_state, schema.alert_history, schema.alert_group
    with db.write_transaction() as conn:
        if removed:
            conn.execute(sa.delete(t).where(t.c.fingerprint.in_(list(removed))))
        for doc in states:
            values = {
                "rule": doc["rule"],
                "state": doc["state"],
                "labels": dict(doc["labels"]),
                "annotations": dict(doc["annotations"]),
                "value": doc.get("value"),
                "active_at": doc["active_since"],
                "fired_at": doc.get("fired_at"),
                "resolved_at": doc.get("resolved_at"),
                "last_eval_at": now,
                "muted": doc.get("muted"),
                "document": dict(doc),
            }
            updated = conn.execute(sa.update(t).where(t.c.fingerprint == doc["fingerprint"]).values(**values))
            if updated.rowcount == 0:
                conn.execute(sa.insert(t).values(fingerprint=doc["fingerprint"], **values))
        if transitions:
            conn.execute(
                sa.insert(h),
                [
                    {
                        "fingerprint": tr["fingerprint"],
                        "rule": tr["rule"],
                        "state": tr["state"],
                        "labels": _with_began(tr["labels"], tr.get("began_at")),
                        "value": tr.get("value"),
                        "at": now,
                    }
                    for tr in transitions
                ],
            )
        stored = {row.key for row in conn.execute(sa.select(g.c.key))}
        gone = stored - set(groups)
        if gone:
            conn.execute(sa.delete(g).where(g.c.key.in_(sorted(gone))))
        for key, state in groups.items():
            if key in stored:
                conn.execute(sa.update(g).where(g.c.key == key).values(state=dict(state), updated_at=now))
            else:
                conn.execute(sa.insert(g).values(key=key, state=dict(state), updated_at=now))


# --- reads for the dashboard and the CLI ---------------------------------------------------------------------------


def _alert_row(row: Any) -> AlertRow:
    return AlertRow(
        fingerprint=row.fingerprint,
        rule=row.rule,
        state=row.state,
        labels=dict(row.labels),
        annotations=dict(row.annotations),
        value=row.value,
        active_at=row.active_at,
        fired_at=row.fired_at,
        resolved_at=row.resolved_at,
        last_eval_at=row.last_eval_at,
    )


def active_alerts(db: Database) -> list[AlertRow]:
    """Firing and pending alerts, firing first, then by when they began."""
    t = schema.alert_state
    query = sa.select(t).where(t.c.state.in_(("firing", "pending"))).order_by(t.c.state, t.c.active_at)
    with db.session() as s:
        return [_alert_row(row) for row in s.execute(query)]


def alert_history(db: Database, start: float, end: float, *, limit: int = 500) -> list[AlertEvent]:
    """State changes in [start, end], newest first."""
    h = schema.alert_history
    query = sa.select(h).where(h.c.at >= start, h.c.at <= end).order_by(h.c.at.desc(), h.c.id.desc()).limit(limit)
    with db.session() as s:
        return [_event(row) for row in s.execute(query)]


def _with_began(labels: Mapping[str, str], began_at: float | None) -> dict[str, str]:
    return dict(labels) if began_at is None else {**labels, BEGAN_LABEL: repr(float(began_at))}


def _event(row: Any) -> AlertEvent:
    labels = {str(k): str(v) for k, v in dict(row.labels).items()}
    began = labels.pop(BEGAN_LABEL, None)
    try:
        began_at = None if began is None else float(began)
    except ValueError:
        began_at = None  # not written by gpulens: the episode begins when its condition held
    return AlertEvent(row.fingerprint, row.rule, row.state, labels, row.value, row.at, began_at)


# --- the outbox ----------------------------------------------------------------------------------------------------


def _outbox_row(row: Any) -> OutboxRow:
    return OutboxRow(
        id=row.id,
        receiver=row.receiver,
        payload=dict(row.payload),
        attempts=row.attempts,
        created_at=row.created_at,
        next_attempt_at=row.next_attempt_at,
        status=row.status,
        last_error=row.last_error,
    )


def outbox_enqueue(db: Database, receiver: str, payload: Mapping[str, Any], now: float) -> int:
    """Store a notification, due now. It replaces any undelivered one of the same receiver and group (the payload's
    ``group_key``): those are marked ``superseded``, and the new one keeps their place in the retry schedule (their
    next attempt time and attempt count), so a group's newer state never overtakes an older one."""
    o = schema.notification_outbox
    key = payload.get("group_key")
    with db.write_transaction() as conn:
        older = []
        if key is not None:
            rows = conn.execute(
                sa.select(o.c.id, o.c.payload, o.c.attempts, o.c.next_attempt_at).where(
                    o.c.status == "pending", o.c.receiver == receiver
                )
            )
            older = [r for r in rows if dict(r.payload).get("group_key") == key]
        result = conn.execute(
            sa.insert(o)
            .values(
                receiver=receiver,
                payload=dict(payload),
                status="pending",
                attempts=max((r.attempts for r in older), default=0),
                next_attempt_at=max([now, *(r.next_attempt_at for r in older)]),
                created_at=now,
            )
            .returning(o.c.id)
        )
        item_id = int(result.scalar_one())
        if older:
            conn.execute(
                sa.update(o)
                .where(o.c.id.in_([r.id for r in older]), o.c.status == "pending")
                .values(status="superseded", last_error=f"replaced by notification {item_id}")
            )
        return item_id


def outbox_next_attempt_at(db: Database) -> float | None:
    """When the earliest pending notification falls due, or None if none is pending."""
    o = schema.notification_outbox
    with db.session() as s:
        value = s.execute(sa.select(sa.func.min(o.c.next_attempt_at)).where(o.c.status == "pending")).scalar()
    return None if value is None else float(value)


def outbox_backlog(db: Database, now: float) -> tuple[int, float]:
    """The notifications waiting for delivery: how many, and how long the oldest has waited (0 when none)."""
    o = schema.notification_outbox
    query = sa.select(sa.func.count(), sa.func.min(o.c.created_at)).where(o.c.status == "pending")
    with db.session() as s:
        count, oldest = s.execute(query).one()
    return int(count), 0.0 if oldest is None else max(0.0, now - float(oldest))


def outbox_due(db: Database, now: float, limit: int) -> list[OutboxRow]:
    o = schema.notification_outbox
    query = (
        sa.select(o)
        .where(o.c.status == "pending", o.c.next_attempt_at <= now)
        .order_by(o.c.next_attempt_at, o.c.id)
        .limit(limit)
    )
    with db.session() as s:
        return [_outbox_row(row) for row in s.execute(query)]


def outbox_items(db: Database, *, status: str | None = None) -> list[OutboxRow]:
    o = schema.notification_outbox
    query = sa.select(o).order_by(o.c.id)
    if status is not None:
        query = query.where(o.c.status == status)
    with db.session() as s:
        return [_outbox_row(row) for row in s.execute(query)]


def outbox_mark(
    db: Database,
    item_id: int,
    *,
    status: str,
    next_attempt_at: float | None = None,
    error: str | None = None,
    count_attempt: bool = True,
) -> None:
    o = schema.notification_outbox
    values: dict[str, Any] = {"status": status, "last_error": error}
    if next_attempt_at is not None:
        values["next_attempt_at"] = next_attempt_at
    if count_attempt:
        values["attempts"] = o.c.attempts + 1
    with db.write_transaction() as conn:
        # Only a pending item moves on: one superseded while its send was in flight stays superseded.
        conn.execute(sa.update(o).where(o.c.id == item_id, o.c.status == "pending").values(**values))


def outbox_retry(db: Database, item_id: int, *, next_attempt_at: float, error: str) -> None:
    """Count a failed attempt of a pending notification and schedule its next one. If a newer state of its group
    superseded it while the send was in flight, the newer one (the pending one of its receiver and group) takes the
    failure over: the attempt count and the later of the two next attempt times, as if it had been enqueued after the
    failure. So a receiver that hangs past the next resend keeps its backoff."""
    o = schema.notification_outbox
    with db.write_transaction() as conn:
        item = conn.execute(
            sa.select(o.c.status, o.c.receiver, o.c.payload, o.c.attempts).where(o.c.id == item_id)
        ).one_or_none()
        if item is None:
            return
        if item.status == "pending":
            values = {"next_attempt_at": next_attempt_at, "last_error": error, "attempts": o.c.attempts + 1}
            conn.execute(sa.update(o).where(o.c.id == item_id).values(**values))
            return
        key = dict(item.payload).get("group_key")
        if item.status != "superseded" or key is None:
            return
        rows = conn.execute(
            sa.select(o.c.id, o.c.payload, o.c.attempts, o.c.next_attempt_at).where(
                o.c.status == "pending", o.c.receiver == item.receiver, o.c.id > item_id
            )
        )
        for heir in [r for r in rows if dict(r.payload).get("group_key") == key]:
            values = {
                "attempts": max(heir.attempts, item.attempts + 1),
                "next_attempt_at": max(heir.next_attempt_at, next_attempt_at),
                "last_error": error,
            }
            conn.execute(sa.update(o).where(o.c.id == heir.id, o.c.status == "pending").values(**values))


def outbox_prune(db: Database, before: float) -> int:
    """Delete the delivered (``sent``) and replaced (``superseded``) notifications created before ``before``;
    pending and failed ones stay. Returns how many went."""
    o = schema.notification_outbox
    with db.write_transaction() as conn:
        done = sa.delete(o).where(o.c.status.in_(("sent", "superseded")), o.c.created_at < before)
        return int(conn.execute(done).rowcount or 0)


# --- silences -------------------------------------------------------------------------------------------------------


def _silence_row(row: Any) -> SilenceRow:
    return SilenceRow(row.id, row.matchers, row.starts_at, row.ends_at, row.comment, row.created_by, row.created_at)


def add_silence(
    db: Database, *, matchers: Any, starts_at: float, ends_at: float, comment: str, created_by: str, now: float
) -> int:
    s = schema.silence
    with db.write_transaction() as conn:
        result = conn.execute(
            sa.insert(s)
            .values(
                matchers=matchers,
                starts_at=starts_at,
                ends_at=ends_at,
                comment=comment,
                created_by=created_by,
                created_at=now,
            )
            .returning(s.c.id)
        )
        return int(result.scalar_one())


def list_silences(db: Database, *, now: float, include_expired: bool = False) -> list[SilenceRow]:
    s = schema.silence
    query = sa.select(s).order_by(s.c.starts_at, s.c.id)
    if not include_expired:
        query = query.where(s.c.ends_at > now)
    with db.session() as session:
        return [_silence_row(row) for row in session.execute(query)]


def expire_silence(db: Database, silence_id: int, now: float) -> bool:
    """End a silence now. False if there is no such silence or it had already ended."""
    s = schema.silence
    with db.write_transaction() as conn:
        result = conn.execute(sa.update(s).where(s.c.id == silence_id, s.c.ends_at > now).values(ends_at=now))
        return bool(result.rowcount)
