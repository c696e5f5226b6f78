"""Alert rounds from a store instead of a scrape: the whole cluster's newest readings, jobs and targets, read
through the store read interface (``gpulens.storage.reading``), so that rules run once, over every GPU.

``store_round`` builds one ``RoundResult`` (what a collector round would have found) from any ``StoreReader``:
Prometheus (``gpulens alerts run --db prometheus+http://...``) or the shared SQL store (``gpulens alerts run`` beside
sharded collectors, or the one collector elected by ``RuleElection``). ``RuleElection`` is that election: a
PostgreSQL advisory lock that one collector of a shard set holds while it runs the rules.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Final

from gpulens.model import GpuJob, GpuReading, NodeSnapshot, ProcessReading, TargetHealth
from gpulens.rounds import RoundHook, RoundResult
from gpulens.storage.db import Database, DatabaseUnavailableError
from gpulens.storage.leader import AdvisoryLock
from gpulens.storage.reading import NotAvailableOnBackendError, StoreReader
from gpulens.storage.sqlreader import SqlReader

log = logging.getLogger(__name__)

RULES_LOCK_KEY: Final = 0x67707572756C6573  # "gpurules": the advisory lock of the process that runs the rules
RULES_STANDBY_NOTE: Final = (
    "another process runs the rules over this store (gpulens alerts run, or the elected collector of a sharded set) "
    "and holds the PostgreSQL advisory lock; this one takes over within one interval if that one stops"
)


def store_round(store: StoreReader, now: float, *, max_age_s: float) -> RoundResult:
    """The cluster now, as one round: GPUs with a reading newer than ``max_age_s``, their jobs and processes."""
    readings = store.latest_readings(max_age_s=max_age_s)
    jobs = store.current_jobs()
    try:
        processes = store.current_processes()
    except NotAvailableOnBackendError:
        processes = []
    return assemble_round(store.backend, now, readings, jobs, processes, store.target_health())


def assemble_round(
    source: str,
    now: float,
    readings: Sequence[GpuReading],
    jobs: Sequence[GpuJob],
    processes: Sequence[ProcessReading],
    targets: Sequence[TargetHealth],
) -> RoundResult:
    """One ``RoundResult`` of what a store gave: a snapshot per node that has readings."""
    gpus: dict[str, list[GpuReading]] = defaultdict(list)
    for r in readings:
        gpus[r.node].append(r)
    node_jobs: dict[str, list[GpuJob]] = defaultdict(list)
    for j in jobs:
        node_jobs[j.node].append(j)
    node_processes: dict[str, list[ProcessReading]] = defaultdict(list)
    for p in processes:
        node_processes[p.node].append(p)
    snapshots = [
        NodeSnapshot(
            node=node,
            timestamp=max(r.timestamp for r in held),
            source=source,
            gpus=tuple(held),
            processes=tuple(node_processes[node]),
            jobs=tuple(node_jobs[node]),
        )
        for node, held in sorted(gpus.items())
    ]
    return RoundResult(time=now, snapshots=snapshots, targets=list(targets), written=True)


class RuleElection:
    """A collector hook that runs the rules over the whole shared store, in the one collector holding the lock.

    Each round, every collector of a shard set tries the PostgreSQL advisory lock; the holder keeps it (on its own
    connection) and evaluates the rules over every GPU in the store, the others do nothing. When the holder dies
    its connection closes, the lock is freed, and another collector takes it at its next round.
    """

    def __init__(self, db: Database, make_rules: Callable[[], RoundHook], *, max_age_s: float) -> None:
        self._lock = AdvisoryLock(db, RULES_LOCK_KEY)
        self._reader = SqlReader(db)
        self._make_rules = make_rules  # built on election, so the engine starts from the stored alert states
        self._rules: RoundHook | None = None
        self._max_age_s = max_age_s
        self.leading = False

    @property
    def supported(self) -> bool:
        """False on SQLite: nobody is elected; run ``gpulens alerts run`` beside the collectors."""
        return self._lock.supported

    def __call__(self, result: RoundResult) -> None:
        if not result.written:
            return
        try:
            leading = self._lock.try_hold()
            if leading != self.leading:
                log.info("this collector %s the alert rules", "now runs" if leading else "no longer runs")
                self.leading = leading
                self._close_rules()
            if leading:
                if self._rules is None:
                    self._rules = self._make_rules()
                self._rules(store_round(self._reader, result.time, max_age_s=self._max_age_s))
        except DatabaseUnavailableError as exc:
            log.warning("alert round postponed: %s", exc)

    def _close_rules(self) -> None:
        """Stop the rules a lost election leaves behind (their notification worker, where they have one)."""
        rules, self._rules = self._rules, None
        close = getattr(rules, "close", None)
        if callable(close):
            close()

    def close(self) -> None:
        self._close_rules()
        self._lock.release()


def run_store_rules(
    store: StoreReader,
    rules: RoundHook,
    *,
    interval_s: float,
    stop: threading.Event,
    clock: Callable[[], float],
    on_round: Callable[[RoundResult], None] | None = None,
    active: Callable[[], bool | None] | None = None,
    read: Callable[[float, float], RoundResult] | None = None,
) -> None:
    """Every ``interval_s`` until ``stop``: read the cluster from ``store`` and hand it to ``rules``. A store that
    cannot be reached postpones the round (logged), it does not end the loop. ``active`` (``Leadership.check``):
    the process's role in its HA pair, asked first: a standby reads nothing and hands ``rules`` a round with
    ``leading=False``; an unknown role (the state store is unreachable) postpones the round. ``read(now,
    max_age_s)`` reads a round instead of ``store_round`` (over Prometheus: ``promround.round_reader``)."""
    max_age_s = max(3 * interval_s, 30.0)
    while not stop.is_set():
        started = time.monotonic()
        role = True if active is None else active()
        if role is None:
            log.warning("alert round postponed: the alert state store is unreachable")
        elif not role:
            rules(RoundResult(time=clock(), snapshots=[], targets=[], leading=False))
        else:
            try:
                now = clock()
                result = read(now, max_age_s) if read is not None else store_round(store, now, max_age_s=max_age_s)
            except DatabaseUnavailableError as exc:
                log.warning("alert round postponed: %s", exc)
            else:
                rules(result)
                if on_round is not None:
                    on_round(result)
        stop.wait(max(0.0, interval_s - (time.monotonic() - started)))
