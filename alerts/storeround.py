"""Alert rounds from a store instead of a scrape: the whole cluster's newest readings, jobs and targets, read
through the store read interface (``gpulens.storage.reading``), so that rules run once, over every GPU.

``store_round`` builds one ``RoundResult`` (what a collector round would have found) from any ``StoreReader``:
Prometheus (``gpulens alerts run --db prometheus+http://...``) or the shared SQL store (``gpulens alerts run`` beside
sharded collectors, or the one collector elected by ``SharedStoreRules``). ``rule_round`` is one round of the rule
runner, given its role: the loop of ``gpulens alerts run`` (``run_store_rules``) and ``SharedStoreRules`` (a collector
hook) both run it. The role comes from ``rules_leadership``: ``storage.leader.Leadership`` on the rules lock, the
same election as the collectors' HA pair, so ``gpulens alerts run`` processes and the collectors of a sharded set
elect one rule runner among them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from gpulens.collector.pair import WhileActive
from gpulens.model import GpuJob, GpuReading, NodeSnapshot, ProcessReading, TargetHealth
from gpulens.nodehardware import NodeHardware
from gpulens.rounds import RoundHook, RoundResult
from gpulens.storage.db import Database, DatabaseUnavailableError
from gpulens.storage.leader import HA_PAIR_ACTIVE, Leadership, on_standby
from gpulens.storage.reading import NotAvailableOnBackendError, SqlReader, StoreReader

log = logging.getLogger(__name__)

RULES_LOCK_KEY: Final = 0x67707572756C6573  # "gpurules": the advisory lock of the process that runs the rules
RULES_STANDBY_NOTE: Final = (
    "another process runs the rules over this store (gpulens alerts run, or the elected collector of a sharded set) "
    "and holds the PostgreSQL advisory lock; this one takes over within one interval if that one stops"
)
# What the collector elected among a sharded set logs (after "this collector"): it is active in its own HA pair too.
ELECTED_ACTIVE: Final = "now runs the alert rules over the whole store (it holds the rules lock)"
ELECTED_STANDBY: Final = f"does not run the alert rules: {RULES_STANDBY_NOTE}"


def rules_leadership(
    db: Database,
    *,
    what: str,
    says_active: str = HA_PAIR_ACTIVE,
    says_standby: str = on_standby(RULES_STANDBY_NOTE),
) -> Leadership:
    """The role of a rule runner (``what``: "this gpulens alerts run") on the rules lock of the store ``db``; it logs
    the lines of an HA pair unless ``says_active`` / ``says_standby`` say otherwise."""
    return Leadership(db, RULES_LOCK_KEY, what=what, says_active=says_active, says_standby=says_standby)


def store_round(store: StoreReader, now: float, *, max_age_s: float) -> RoundResult:
    """The cluster now, as one round: GPUs with a reading newer than ``max_age_s``, their jobs and processes."""
    readings = store.latest_readings(max_age_s=max_age_s)
    jobs = store.current_jobs()
    try:
        processes = store.current_processes()
    except NotAvailableOnBackendError:
        processes = []
    nodes = sorted({r.node for r in readings})
    try:
        hardware = store.latest_hardware(nodes) if nodes else {}
    except NotAvailableOnBackendError:  # Prometheus: the exported rules read the node's families there
        hardware = {}
    return assemble_round(store.backend, now, readings, jobs, processes, store.target_health(), hardware)


def assemble_round(
    source: str,
    now: float,
    readings: Sequence[GpuReading],
    jobs: Sequence[GpuJob],
    processes: Sequence[ProcessReading],
    targets: Sequence[TargetHealth],
    hardware: Mapping[str, tuple[NodeHardware, str | None]] | None = None,
) -> RoundResult:
    """One ``RoundResult`` of what a store gave: a snapshot per node that has readings, with its stored hardware and
    driver version where the store keeps them."""
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
            hardware=(hardware or {}).get(node, (None, None))[0],
            driver_version=(hardware or {}).get(node, (None, None))[1],
        )
        for node, held in sorted(gpus.items())
    ]
    return RoundResult(time=now, snapshots=snapshots, targets=list(targets), written=True)


def rule_round(
    rules: RoundHook, role: bool | None, now: float, read: Callable[[float], RoundResult]
) -> RoundResult | None:
    """One round of a rule runner whose role (``Leadership.check``) is ``role``: active, it reads the cluster at
    ``now`` (``read(now)``), hands the round to ``rules`` and returns it; on standby it reads nothing and hands
    ``rules`` a round with ``leading=False`` (``WhileActive`` closes what ran while active). An unknown role (the
    state store is unreachable) or a store that cannot be read postpones the round (logged)."""
    if role is None:
        log.warning("alert round postponed: the alert state store is unreachable")
        return None
    if not role:
        rules(RoundResult(time=now, snapshots=[], targets=[], leading=False))
        return None
    try:
        result = read(now)
    except DatabaseUnavailableError as exc:
        log.warning("alert round postponed: %s", exc)
        return None
    rules(result)
    return result


class SharedStoreRules:
    """A collector hook that runs the rules over the whole shared store, in the one collector holding the rules
    lock (``rules_leadership``, which ``gpulens alerts run`` holds too).

    Each round, every collector of a shard set tries the lock; the holder keeps it (on its own connection) and
    evaluates the rules over every GPU in the store, the others do nothing. When the holder dies its connection
    closes, the lock is freed, and another collector takes it at its next round.
    """

    def __init__(self, db: Database, make_rules: Callable[[], RoundHook], *, max_age_s: float) -> None:
        self.leadership = rules_leadership(
            db, what="this collector", says_active=ELECTED_ACTIVE, says_standby=ELECTED_STANDBY
        )
        self._reader = SqlReader(db)
        self._rules = WhileActive(make_rules)  # built on election, so the engine starts from the stored states
        self._max_age_s = max_age_s

    @property
    def supported(self) -> bool:
        """False on SQLite: nobody is elected; run ``gpulens alerts run`` beside the collectors."""
        return self.leadership.supported

    @property
    def leading(self) -> bool:
        return self.leadership.active is True

    def __call__(self, result: RoundResult) -> None:
        if not result.written:
            return
        rule_round(self._rules, self.leadership.check(), result.time, self._read)

    def _read(self, now: float) -> RoundResult:
        return store_round(self._reader, now, max_age_s=self._max_age_s)

    def close(self) -> None:
        self._rules.close()  # the notification worker stops before the lock goes to another process
        self.leadership.release()


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
    cannot be reached postpones the round (logged), it does not end the loop. ``active`` (``Leadership.check`` of
    ``rules_leadership``): the process's role in its HA pair, asked first (``rule_round``: a standby reads nothing and
    hands ``rules`` a round with ``leading=False``; an unknown role postpones the round). ``read(now,
    max_age_s)`` reads a round instead of ``store_round`` (over Prometheus: ``promround.round_reader``)."""
    max_age_s = max(3 * interval_s, 30.0)

    def read_round(now: float) -> RoundResult:
        return read(now, max_age_s) if read is not None else store_round(store, now, max_age_s=max_age_s)

    while not stop.is_set():
        started = time.monotonic()
        role = True if active is None else active()
        result = rule_round(rules, role, clock(), read_round)
        if result is not None and on_round is not None:
            on_round(result)
        stop.wait(max(0.0, interval_s - (time.monotonic() - started)))
