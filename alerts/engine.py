"""The alert engine: after each scrape round, evaluate the rules, advance the alerts, form the incidents
(``alerts.incidents``), group and queue notifications (Slack, webhook and log receivers: the incidents due, one
message a round; Alertmanager: each member alert with its incident's labels, the old ones withdrawn on a change).

``AlertEngine`` holds everything in memory. In the collector, storage loads ``states`` and ``groups`` when it starts
and saves what ``process`` returns after each round (so a restart neither forgets a firing alert nor notifies it
again), and the outbox is the SQL one; ``gpulens simulate`` and the tests use it as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gpulens.alerts.base import AlertRule, Candidate
from gpulens.alerts.causes import Explains, table
from gpulens.alerts.culpritaddress import CulpritAddresses, Lookup
from gpulens.alerts.grouping import Grouper, GroupState, Notification, Route
from gpulens.alerts.history import History
from gpulens.alerts.incidentnotify import BATCH_KEY, labelled, notify_round, withdrawn
from gpulens.alerts.incidents import Incident, annotate, form
from gpulens.alerts.notify.delivery import OutboxStore
from gpulens.alerts.rules import data_missing, evaluate, required_window_s
from gpulens.alerts.state import (
    DEFAULT_INHIBITIONS,
    AlertState,
    Inhibition,
    Silence,
    StepResult,
    silencer,
    step,
)
from gpulens.model import NodeSnapshot, TargetHealth


@dataclass(frozen=True)
class EngineRound:
    """What one round of the engine decided."""

    time: float
    candidates: list[Candidate]
    result: StepResult
    groups: dict[str, GroupState]
    notifications: list[Notification]
    outbox_ids: list[int]
    incidents: dict[str, Incident] = field(default_factory=dict)


def _no_silences() -> Sequence[Silence]:
    return ()


class AlertEngine:
    """Rules, history, alert states, grouping and the outbox, driven one scrape round at a time."""

    def __init__(
        self,
        rules: Sequence[AlertRule],
        *,
        routes: Sequence[Route] = (),
        outbox: OutboxStore | None = None,
        silences: Callable[[], Sequence[Silence]] = _no_silences,
        states: Mapping[str, AlertState] | None = None,
        groups: Mapping[str, GroupState] | None = None,
        history: History | None = None,
        dashboard_url: str | None = None,
        inhibitions: Sequence[Inhibition] = DEFAULT_INHIBITIONS,
        destinations: Mapping[str, Sequence[str]] | None = None,
        incidents: Mapping[str, Incident] | None = None,
        gpu_addresses: Lookup | None = None,
        causes: Sequence[Explains] = (),
    ) -> None:
        """``destinations``: a receiver's outbox destinations when it has several (an alertmanager receiver's URLs:
        each gets its own copy of every notification, delivered and retried on its own); else the receiver.
        ``gpu_addresses``: the store's PCI addresses of GPUs, for a GPU culprit whose address the history lacks
        (``alerts.culpritaddress``). ``causes``: the config's rows of the causal table (``[[alerts.causes]]``), after
        the builtin ones."""
        names = [r.name for r in rules]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"rules defined twice: {', '.join(duplicates)}")
        self.rules = tuple(rules)
        self.rules_by_name = {r.name: r for r in rules}
        self.history = history or History(required_window_s(rules))
        self.grouper = Grouper(routes)
        self.outbox = outbox
        self.states: dict[str, AlertState] = dict(states or {})
        self.groups: dict[str, GroupState] = dict(groups or {})
        self.incidents: dict[str, Incident] = dict(incidents or {})
        self._silences = silences
        self._dashboard_url = dashboard_url
        self._inhibitions = tuple(inhibitions)
        self._causes = table(causes)
        self._destinations = {k: tuple(v) for k, v in (destinations or {}).items()}
        self.addresses = CulpritAddresses(gpu_addresses)

    def process(self, now: float, snapshots: Sequence[NodeSnapshot], targets: Sequence[TargetHealth]) -> EngineRound:
        """Take one scrape round: add it to the history, evaluate, step the alerts, group and enqueue."""
        self.history.add(now, snapshots, targets)
        candidates = evaluate(self.rules, self.history, now)
        history = self.history
        result = step(
            self.states,
            candidates,
            self.rules_by_name,
            now,
            silenced=silencer(self._silences(), now),
            held=lambda rule, labels: data_missing(history, rule, labels),
            inhibitions=self._inhibitions,
            dashboard_url=self._dashboard_url,
        )
        return self.settle(now, result, candidates)

    def settle(self, now: float, result: StepResult, candidates: Sequence[Candidate] = ()) -> EngineRound:
        """After the alerts stepped: form the incidents, group and enqueue the round's notifications."""
        incidents = self.addresses.fill(form(self.incidents, result.states, now, self._causes), self.history)
        annotate(result.states, incidents)
        sent_before = labelled(self.states.values(), self.incidents)
        self.states = result.states
        alert_groups = {k: g for k, g in self.groups.items() if k != BATCH_KEY}
        sent_now = labelled(result.states.values(), incidents)
        grouping = self.grouper.step(alert_groups, sent_now, now)
        self.incidents, notes, batch = notify_round(
            self.grouper, incidents, result.states, now, self._dashboard_url, self.groups.get(BATCH_KEY)
        )
        self.groups = {**grouping.groups, **({BATCH_KEY: batch} if batch is not None else {})}
        ended = withdrawn(self.grouper, sent_before, sent_now, now)
        notifications = [*ended, *grouping.notifications, *notes]
        ids = []
        if self.outbox is not None:
            ids = [
                self.outbox.enqueue(destination, n.payload(), now)
                for n in notifications
                for destination in self._destinations.get(n.receiver, (n.receiver,))
            ]
        return EngineRound(now, list(candidates), result, dict(self.groups), notifications, ids, dict(self.incidents))
