"""The alert engine inside the collector: rules after each scrape round, state and outbox in SQL, delivery.

``AlertService`` loads the engine's states and notification groups from the database (so a restarted collector
neither forgets a firing alert nor notifies it again) and refills the rules' history from the stored readings of
the last window (``storage.recent``), so the stall and straggler baselines survive a restart. It runs after every
round as a collector hook, saves what changed and writes the round's notifications into the durable outbox.
Delivery is not part of the round: the hook wakes the notification worker (``alerts.notify.worker``), which sends
on its own thread, so a receiver that hangs never delays a scrape. A database that is down when the service starts
is tolerated: the states are loaded at the first round that reaches it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpulens.alerts.commandaction import CommandAction, CommandConfig
from gpulens.alerts.config import AlertingConfig, build_notifiers, parse_alerting
from gpulens.alerts.culpritaddress import Lookup
from gpulens.alerts.drain import SlurmDrainer, remediation_line
from gpulens.alerts.engine import AlertEngine, EngineRound
from gpulens.alerts.grouping import GroupState
from gpulens.alerts.incidentread import read_incidents, read_open_incidents
from gpulens.alerts.incidents import RESOLVED_KEEP_S, Incident
from gpulens.alerts.matchers import matchers_from_json
from gpulens.alerts.notify import Notifier
from gpulens.alerts.notify.delivery import Backoff, Delivery, DeliveryCounts, OutboxItem
from gpulens.alerts.notify.slack import SlackNotifier
from gpulens.alerts.notify.worker import DEFAULT_POLL_S, NotificationWorker
from gpulens.alerts.state import DEFAULT_INHIBITIONS, AlertState, Silence
from gpulens.clock import Clock, SystemClock
from gpulens.model import NodeSnapshot, TargetHealth
from gpulens.rounds import RoundResult
from gpulens.settings import Settings
from gpulens.storage import alertstore, incidentstore
from gpulens.storage.db import Database, DatabaseUnavailableError
from gpulens.storage.recent import recent_rounds
from gpulens.storage.slurmtables import decisions_for

log = logging.getLogger(__name__)

# Delivered notifications stay in the outbox this long (an alertmanager receiver adds one per group and URL every
# minute), and are pruned at most this often.
OUTBOX_KEEP_S = 3600.0
OUTBOX_PRUNE_EVERY_S = 600.0


class SqlOutbox:
    """The ``OutboxStore`` protocol over the notification_outbox table."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def enqueue(self, receiver: str, payload: Mapping[str, Any], now: float) -> int:
        return alertstore.outbox_enqueue(self._db, receiver, payload, now)

    def due(self, now: float, limit: int) -> list[OutboxItem]:
        return [
            OutboxItem(
                id=r.id,
                receiver=r.receiver,
                payload=r.payload,
                attempts=r.attempts,
                created_at=r.created_at,
                next_attempt_at=r.next_attempt_at,
                status=r.status,
                last_error=r.last_error,
            )
            for r in alertstore.outbox_due(self._db, now, limit)
        ]

    def next_attempt_at(self) -> float | None:
        return alertstore.outbox_next_attempt_at(self._db)

    def mark_sent(self, item_id: int, now: float) -> None:
        alertstore.outbox_mark(self._db, item_id, status="sent")

    def mark_retry(self, item_id: int, next_attempt_at: float, error: str) -> None:
        alertstore.outbox_retry(self._db, item_id, next_attempt_at=next_attempt_at, error=error)

    def mark_failed(self, item_id: int, error: str) -> None:
        alertstore.outbox_mark(self._db, item_id, status="failed", error=error)


def silences_from_rows(rows: Sequence[alertstore.SilenceRow]) -> list[Silence]:
    return [
        Silence(
            id=str(r.id),
            matchers=matchers_from_json(r.matchers),
            starts_at=r.starts_at,
            ends_at=r.ends_at,
            comment=r.comment,
            created_by=r.created_by,
        )
        for r in rows
    ]


def alerting_config(settings: Settings) -> AlertingConfig:
    """The ``[alerts]`` section of the settings, validated (errors name the file, the key and the line)."""
    return parse_alerting(settings.raw.get("alerts"), source=settings.source, locator=settings.locator)


class AlertService:
    """The alert engine as a collector hook over SQL, with its notification worker.

    ``start()`` starts the worker and ``close()`` stops it (within 5 s); without ``start()`` nothing is delivered
    unless ``deliver()`` is called (tests, one-shot tools). The service is itself the round hook."""

    def __init__(
        self,
        db: Database,
        config: AlertingConfig,
        *,
        clock: Clock | None = None,
        notifiers: Mapping[str, Notifier] | None = None,
        environ: Mapping[str, str] | None = None,
        backoff: Backoff | None = None,
        poll_s: float = DEFAULT_POLL_S,
        interval_s: float = 10.0,
        load_at_first_round: bool = False,
        gpu_addresses: Lookup | None = None,
    ) -> None:
        """``load_at_first_round``: load the stored states at the first round instead of now (a service built for a
        round that is already stored, as ``collector.pair.WhileActive`` builds it, must not count that round as
        history). ``gpu_addresses``: the store's PCI addresses of GPUs (``culpritaddress.from_store``), for the
        incidents' GPU culprits."""
        self._db = db
        self._interval_s = interval_s
        self._clock = clock or SystemClock()
        self.outbox = SqlOutbox(db)
        self.engine = AlertEngine(
            config.rules,
            routes=config.routes,
            outbox=self.outbox,
            silences=self._silences,
            dashboard_url=config.dashboard_url,
            destinations=config.destinations(),
            gpu_addresses=gpu_addresses,
            causes=config.causes,
            inhibitions=(*DEFAULT_INHIBITIONS, *config.inhibitions),
        )
        self._loaded = False
        self._saved: dict[str, Incident] = {}  # the incidents as last written
        self._pruned_at = float("-inf")
        try:
            if not load_at_first_round:
                self._load()
        except DatabaseUnavailableError as exc:
            log.warning("alert states not loaded yet (%s): loaded at the first round that reaches the database", exc)
        self._notifiers = dict(
            notifiers
            if notifiers is not None
            else build_notifiers(
                config.receivers, dashboard_url=config.dashboard_url, environ=environ, eval_interval_s=interval_s
            )
        )
        for action in config.actions:  # [[alerts.actions]]: run by the same worker, audited in drain_action
            actor = (
                CommandAction(action, db, clock=self._clock.now)
                if isinstance(action, CommandConfig)
                else SlurmDrainer(action, db, clock=self._clock.now)
            )
            self._notifiers.setdefault(action.name, actor)
        for notifier in self._notifiers.values():
            if isinstance(notifier, SlackNotifier) and config.actions:
                notifier.remediation = self._remediation_line
        self.delivery = Delivery(self.outbox, self._notifiers, clock=self._clock, backoff=backoff)
        self.worker = NotificationWorker(self.delivery, poll_s=poll_s)

    def _remediation_line(self, alert: AlertState) -> str:
        """What the actions did about the alert, newest decision per action: "slurm-drain drained node-07"."""
        return remediation_line(decisions_for(self._db, alert.fingerprint))

    def _load(self, before: float | None = None) -> None:
        """The stored states, groups and recent rounds, once.

        Raises DatabaseUnavailableError (the caller tries again later)."""
        if self._loaded:
            return
        states = {doc["fingerprint"]: AlertState.from_json(doc) for doc in alertstore.load_alert_states(self._db)}
        groups = {key: GroupState.from_json(doc) for key, doc in alertstore.load_alert_groups(self._db).items()}
        # Rounds older than the one about to be judged; its own readings may be stored already.
        end = (self._clock.now() if before is None else before) - self._interval_s / 2
        history = self.engine.history
        rounds = recent_rounds(self._db, since=end - history.window_s, until=end, interval_s=self._interval_s)
        for time_, snapshots in rounds:
            history.add(time_, snapshots)
        self.engine.states = states
        self.engine.groups = groups
        self.engine.incidents = {i.id: i for i in read_incidents(self._db, since=end - RESOLVED_KEEP_S)}
        self._saved = {i.id: i for i in self.engine.incidents.values()}
        self._loaded = True
        if states or rounds:
            firing = sum(1 for s in states.values() if s.state == "firing")
            log.info(
                "alert engine resumed with %d stored alerts (%d firing) and %d stored rounds of history",
                len(states),
                firing,
                len(rounds),
            )

    def _silences(self) -> list[Silence]:
        return silences_from_rows(alertstore.list_silences(self._db, now=self._clock.now()))

    def start(self) -> AlertService:
        """Start the notification worker; returns the service (the hook)."""
        self.worker.start()
        self.worker.wake()  # deliver what a previous process left in the outbox
        return self

    def close(self) -> None:
        self.worker.stop(timeout_s=5.0)

    def process(self, now: float, snapshots: Sequence[NodeSnapshot], targets: Sequence[TargetHealth]) -> EngineRound:
        """One engine round: evaluate, save the new states, history and groups, enqueue notifications."""
        self._load(before=now)
        result = self.engine.process(now, snapshots, targets)
        alertstore.save_alert_round(
            self._db,
            states=[s.to_json() for s in result.result.states.values()],
            removed=result.result.removed,
            transitions=[
                {
                    "fingerprint": t.fingerprint,
                    "rule": t.rule,
                    "state": t.state,
                    "labels": dict(t.labels),
                    "value": t.value,
                    "began_at": t.began_at,
                }
                for t in result.result.transitions
            ],
            groups={key: g.to_json() for key, g in result.groups.items()},
            now=now,
        )
        self._save_incidents(result.incidents, now)
        if now - self._pruned_at >= OUTBOX_PRUNE_EVERY_S:
            alertstore.outbox_prune(self._db, before=now - OUTBOX_KEEP_S)
            self._pruned_at = now
        return result

    def _save_incidents(self, incidents: Mapping[str, Incident], now: float) -> None:
        """Write the incidents that changed this round; delete those merged into another."""
        changed = [i.to_json() for i in incidents.values() if self._saved.get(i.id) != i]
        merged = [key for key, i in self._saved.items() if i.is_open and key not in incidents]
        incidentstore.save_incidents(self._db, changed, merged, now)
        self._saved = dict(incidents)

    def deliver(self, now: float | None = None) -> DeliveryCounts:
        """One delivery pass on the calling thread (the worker does this on its own)."""
        return self.delivery.run_due(self._clock.now() if now is None else now)

    def hook(self, result: RoundResult) -> None:
        """The collector's post-round hook: evaluate and enqueue, then wake the worker; it never sends.

        A database outage postpones the round's alerts, it does not crash."""
        if not result.written:
            return  # the round is spooled: judge it when it is stored, not from a partial view
        try:
            started = time.perf_counter()
            round_ = self.process(result.time, result.snapshots, result.targets)
            if log.isEnabledFor(logging.DEBUG):
                latest = self.engine.history.latest
                log.debug(
                    "alert round took %.3fs: %d GPUs, %d jobs, candidates %s",
                    time.perf_counter() - started,
                    sum(len(s.gpus) for s in result.snapshots),
                    len(latest.jobs) if latest is not None else 0,
                    sorted({(c.rule, c.hold) for c in round_.candidates}) or "none",
                )
        except DatabaseUnavailableError as exc:
            log.warning("alert round postponed: %s", exc)
            return
        if round_.outbox_ids:
            self.worker.wake()

    __call__ = hook


class SqlAlertReader:
    """What the dashboard reads about alerts (``dashboard.alertdata.AlertReader``), from the engine's SQL tables."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def active(self) -> list[AlertState]:
        states = [AlertState.from_json(doc) for doc in alertstore.load_alert_states(self._db)]
        return [s for s in states if s.state in ("pending", "firing")]

    def history(self, start: float, end: float) -> list[AlertState]:
        """Alert episodes overlapping [start, end], rebuilt from the stored transitions, newest first."""
        events = sorted(alertstore.alert_history(self._db, start - 86400.0, end, limit=5000), key=lambda e: e.at)
        current = {doc["fingerprint"]: doc for doc in alertstore.load_alert_states(self._db)}
        open_: dict[str, AlertState] = {}
        episodes: list[AlertState] = []
        for e in events:
            episode = open_.get(e.fingerprint)
            if e.state == "pending" or (e.state == "firing" and episode is None):
                doc = current.get(e.fingerprint)
                annotations = dict(doc["annotations"]) if doc else {}
                episode = AlertState(
                    fingerprint=e.fingerprint,
                    rule=e.rule,
                    labels=dict(e.labels),
                    annotations=annotations,
                    state=e.state,
                    active_since=e.at,
                    fired_at=e.at if e.state == "firing" else None,
                    last_seen=e.at,
                    value=e.value,
                    began_at=e.began_at,
                )
                open_[e.fingerprint] = episode
            elif e.state == "firing" and episode is not None:
                open_[e.fingerprint] = replace(episode, state="firing", fired_at=e.at, last_seen=e.at, value=e.value)
            elif e.state in ("resolved", "inactive") and episode is not None:
                closed = replace(episode, state="resolved", resolved_at=e.at, last_seen=e.at)
                del open_[e.fingerprint]
                if closed.fired_at is not None and closed.resolved_at is not None and closed.resolved_at >= start:
                    episodes.append(closed)
        episodes.extend(s for s in open_.values() if s.fired_at is not None or s.state == "pending")
        return sorted((s for s in episodes if s.active_since <= end), key=lambda s: s.active_since, reverse=True)

    def silences(self, now: float) -> list[Silence]:
        return silences_from_rows(alertstore.list_silences(self._db, now=now))

    def open_incidents(self) -> list[Incident]:
        return read_open_incidents(self._db)

    def incidents(self, since: float) -> list[Incident]:
        return read_incidents(self._db, since)
