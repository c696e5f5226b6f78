"""Routing and grouping of alerts into notifications, the way Alertmanager does it (pure).

Each alert goes to the first route whose matchers match its labels (and on to the next ones while a matched route
says ``continue``). Within a route, alerts with the same values of the ``group_by`` labels form a group; ``["..."]``
groups by every label. A new group waits ``group_wait`` before its first notification, so that alerts that start
together arrive together; after that the group is looked at every ``group_interval`` and notified when it has new
firing alerts or newly resolved ones, and re-notified every ``repeat_interval`` while anything fires. Muted (silenced
or inhibited) alerts are left out, and only alerts notified as firing are notified as resolved.

``Grouper.step`` is a pure function of the group states (which storage keeps, so a restart does not notify again),
the alert states and ``now``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from gpulens.alerts.matchers import Matcher, matches_all
from gpulens.alerts.state import FIRING, RESOLVED, AlertState
from gpulens.config import format_timestamp

ALL_LABELS: Final = "..."


@dataclass(frozen=True)
class Route:
    """Where matching alerts go and how they are grouped (Alertmanager's route, one level deep)."""

    receiver: str
    matchers: tuple[Matcher, ...] = ()
    group_by: tuple[str, ...] = ("alertname",)
    group_wait_s: float = 30.0
    group_interval_s: float = 300.0
    repeat_interval_s: float = 4 * 3600.0
    continue_: bool = False
    send_resolved: bool = True
    # The receiver takes incidents (``alerts.incidentnotify``), not the member alerts of one on their own.
    incidents: bool = False
    # Its receiver takes one message a round for all the incidents due (Slack, webhook and log receivers); actions
    # take one case per incident (``alerts.incidentnotify``).
    batch: bool = False

    def matches(self, labels: Mapping[str, str]) -> bool:
        return matches_all(self.matchers, labels)

    def group_labels(self, labels: Mapping[str, str]) -> dict[str, str]:
        if ALL_LABELS in self.group_by:
            return dict(labels)
        return {k: labels[k] for k in self.group_by if labels.get(k)}


@dataclass(frozen=True)
class GroupState:
    """One group of one route, between rounds."""

    key: str
    receiver: str
    route: int  # the route's position in the routing list
    labels: Mapping[str, str]
    created_at: float
    next_flush_at: float
    last_notified_at: float | None = None
    notified: frozenset[str] = field(default_factory=frozenset)  # fingerprints last notified as firing

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "receiver": self.receiver,
            "route": self.route,
            "labels": dict(self.labels),
            "created_at": self.created_at,
            "next_flush_at": self.next_flush_at,
            "last_notified_at": self.last_notified_at,
            "notified": sorted(self.notified),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GroupState:
        last = data.get("last_notified_at")
        return cls(
            key=str(data["key"]),
            receiver=str(data["receiver"]),
            route=int(data["route"]),
            labels={str(k): str(v) for k, v in data["labels"].items()},
            created_at=float(data["created_at"]),
            next_flush_at=float(data["next_flush_at"]),
            last_notified_at=None if last is None else float(last),
            notified=frozenset(str(f) for f in data.get("notified", ())),
        )


@dataclass(frozen=True)
class Notification:
    """One message to one receiver: a group's firing and newly resolved alerts."""

    receiver: str
    group_key: str
    group_labels: Mapping[str, str]
    status: str  # "firing" while any alert of the group fires, else "resolved"
    alerts: tuple[AlertState, ...]
    created_at: float
    # A message about several incidents (``alerts.incidentnotify``): each one's verdict, as a single incident's
    # message carries it in ``group_labels``; empty otherwise.
    incidents: tuple[Mapping[str, str], ...] = ()

    def payload(self) -> dict[str, Any]:
        """The outbox payload (JSON); ``from_payload`` reads it back for delivery."""
        return {
            "receiver": self.receiver,
            "group_key": self.group_key,
            "group_labels": dict(self.group_labels),
            "status": self.status,
            "alerts": [a.to_json() for a in self.alerts],
            "created_at": self.created_at,
            "created": format_timestamp(self.created_at),
            **({"incidents": [dict(i) for i in self.incidents]} if self.incidents else {}),
        }

    @classmethod
    def from_payload(cls, data: Mapping[str, Any]) -> Notification:
        """Raises ``ValueError`` for a payload that is not a notification."""
        try:
            return cls(
                receiver=str(data["receiver"]),
                group_key=str(data["group_key"]),
                group_labels={str(k): str(v) for k, v in data["group_labels"].items()},
                status=str(data["status"]),
                alerts=tuple(AlertState.from_json(a) for a in data["alerts"]),
                created_at=float(data["created_at"]),
                incidents=tuple({str(k): str(v) for k, v in i.items()} for i in data.get("incidents", ())),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a notification payload: {exc!r:.80}") from None


@dataclass(frozen=True)
class GroupingResult:
    groups: dict[str, GroupState]
    notifications: list[Notification]


def group_key(route_index: int, receiver: str, labels: Mapping[str, str]) -> str:
    pairs = ",".join(f'{k}="{labels[k]}"' for k in sorted(labels))
    return f'{{route="{route_index}",receiver="{receiver}"}}:{{{pairs}}}'


@dataclass
class _Members:
    route: int
    labels: dict[str, str]
    firing: dict[str, AlertState] = field(default_factory=dict)
    resolved: dict[str, AlertState] = field(default_factory=dict)


class Grouper:
    """Decides, round by round, which notifications to send (Alertmanager-like)."""

    def __init__(self, routes: Sequence[Route]) -> None:
        self.routes = tuple(routes)

    def routes_for(self, labels: Mapping[str, str]) -> list[int]:
        """The positions of the routes an alert with ``labels`` goes to."""
        out = []
        for i, route in enumerate(self.routes):
            if route.matches(labels):
                out.append(i)
                if not route.continue_:
                    break
        return out

    def step(self, groups: Mapping[str, GroupState], alerts: Iterable[AlertState], now: float) -> GroupingResult:
        members = self._members(alerts)
        new_groups: dict[str, GroupState] = {}
        notifications: list[Notification] = []
        for key in sorted(set(members) | set(groups)):
            prev, m = groups.get(key), members.get(key)
            route_index = prev.route if prev is not None else m.route if m is not None else -1
            if not 0 <= route_index < len(self.routes):
                continue  # the route is gone from the config
            route = self.routes[route_index]
            group = prev or self._new_group(key, route_index, route, m, now)
            if group is None:
                continue
            firing = m.firing if m else {}
            resolved = {fp: a for fp, a in (m.resolved if m else {}).items() if fp in group.notified}
            if now < group.next_flush_at:
                new_groups[key] = group
                continue
            group, note = self._flush(group, route, firing, resolved, now)
            if note is not None:
                notifications.append(note)
            if firing or group.notified:
                new_groups[key] = group
        return GroupingResult(new_groups, notifications)

    def _members(self, alerts: Iterable[AlertState]) -> dict[str, _Members]:
        members: dict[str, _Members] = {}
        for alert in alerts:
            if alert.muted is not None or alert.state not in (FIRING, RESOLVED):
                continue
            for i in self.routes_for(alert.labels):
                if self.routes[i].incidents and "incident" in alert.labels:
                    continue  # notified as its incident
                labels = self.routes[i].group_labels(alert.labels)
                key = group_key(i, self.routes[i].receiver, labels)
                entry = members.setdefault(key, _Members(i, labels))
                (entry.firing if alert.state == FIRING else entry.resolved)[alert.fingerprint] = alert
        return members

    @staticmethod
    def _new_group(key: str, index: int, route: Route, m: _Members | None, now: float) -> GroupState | None:
        if m is None or not m.firing:
            return None  # only resolved alerts that were never notified: nothing to say
        return GroupState(key, route.receiver, index, m.labels, created_at=now, next_flush_at=now + route.group_wait_s)

    @staticmethod
    def _flush(
        group: GroupState,
        route: Route,
        firing: Mapping[str, AlertState],
        resolved: Mapping[str, AlertState],
        now: float,
    ) -> tuple[GroupState, Notification | None]:
        new = set(firing) - group.notified
        repeat = bool(firing) and (
            group.last_notified_at is None or now - group.last_notified_at >= route.repeat_interval_s
        )
        send_resolved = bool(resolved) and route.send_resolved
        next_flush = now + route.group_interval_s
        if not (new or send_resolved or repeat):
            return replace(group, notified=group.notified & set(firing), next_flush_at=next_flush), None
        alerts = tuple(sorted(firing.values(), key=_order)) + (
            tuple(sorted(resolved.values(), key=_order)) if route.send_resolved else ()
        )
        note = Notification(
            receiver=route.receiver,
            group_key=group.key,
            group_labels=group.labels,
            status=FIRING if firing else RESOLVED,
            alerts=alerts,
            created_at=now,
        )
        return replace(group, notified=frozenset(firing), last_notified_at=now, next_flush_at=next_flush), note


def _order(alert: AlertState) -> tuple[str, str, str]:
    labels = alert.labels
    return (labels.get("alertname", ""), labels.get("node", ""), labels.get("gpu", "").zfill(4))
