"""The HA pair: two collectors started with the same targets against the same PostgreSQL store, one active.

The pair needs no flag, as two identical Prometheus servers need none: ``pair_key`` hashes what a collector scrapes
(its static targets, its file_sd files and its shard) into the key of a PostgreSQL advisory lock, and
``pair_leadership`` elects on it with ``storage.leader.Leadership`` (the one election, which the rule runner uses
too). The collector holding it scrapes, writes, runs the rules and delivers the notifications; the other one scrapes
nothing and tries the lock at each tick, so when the active one dies (its connection closes and the server frees
the lock) the standby takes over at its next tick, within one interval. The alert states, notification groups and
outbox are in the store, so the new active one resumes them.

``WhileActive`` is the round hook that exists only in the active process (a collector, a rule runner): the alert
service is built when the process becomes active (so it starts from the stored states) and closed when it stops
being active (its notification worker with it).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

from gpulens.rounds import RoundHook, RoundResult
from gpulens.settings import Settings
from gpulens.storage.db import Database
from gpulens.storage.leader import Leadership, on_standby

STANDBY_NOTE = (
    "another collector with the same targets holds the PostgreSQL advisory lock; this one scrapes nothing and takes "
    "over within one interval if that one stops"
)


def pair_key(settings: Settings) -> int:
    """The advisory lock key of the collectors that scrape what ``settings`` scrapes (a signed 64-bit integer)."""
    what = {
        "targets": sorted([t.name, t.url, t.kind, t.node or ""] for t in settings.targets),
        "file_sd": sorted([sorted(f.files), f.kind] for f in settings.file_sd),
        "shard": list(settings.shard),
    }
    digest = hashlib.sha256(b"gpulens-collector-pair\0" + json.dumps(what, sort_keys=True).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def pair_leadership(db: Database, settings: Settings) -> Leadership:
    """The role of the collector that scrapes what ``settings`` scrapes in its HA pair on ``db``."""
    return Leadership(db, pair_key(settings), what="this collector", says_standby=on_standby(STANDBY_NOTE))


class WhileActive:
    """A round hook built when its process becomes active (``RoundResult.leading``) and closed when it stops being
    active: what it runs (the rules, the notification worker) runs in the active process of a pair only."""

    def __init__(self, make: Callable[[], RoundHook]) -> None:
        self._make = make
        self._hook: RoundHook | None = None

    @property
    def running(self) -> bool:
        return self._hook is not None

    @property
    def hook(self) -> RoundHook | None:
        """What runs while active; None while standing by (or before the first active round)."""
        return self._hook

    def __call__(self, result: RoundResult) -> None:
        if not result.leading:
            self.close()
            return
        if self._hook is None:
            self._hook = self._make()
        self._hook(result)

    def close(self) -> None:
        hook, self._hook = self._hook, None
        close = getattr(hook, "close", None)
        if callable(close):
            close()
