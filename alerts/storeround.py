"""Alert rounds from a store instead of a scrape: the whole cluster's newest readings, jobs and targets, read
through the store read interface (``gpulens.storage.reading``), so that rules run once, over every GPU.

``store_round`` builds one ``RoundResult`` (what a collector round would have found: GPUs, jobs, processes, RDMA ports,
hosts and NCCL views, as far as the rules' ``RoundReads`` ask) from any ``StoreReader``:
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, TypeVar

from gpulens.alerts.base import AlertRule
from gpulens.alerts.catalogue import definition
from gpulens.collector.pair import WhileActive
from gpulens.fabricmodel import HostReading, JobHostReading, NicReading
from gpulens.model import GpuJob, GpuReading, NodeSnapshot, ProcessReading, TargetHealth
from gpulens.ncclinspect import InspectorView
from gpulens.ncclmodel import NcclView
from gpulens.nodehardware import NodeHardware
from gpulens.rounds import RoundHook, RoundResult
from gpulens.storage.db import Database, DatabaseUnavailableError
from gpulens.storage.leader import HA_PAIR_ACTIVE, Leadership, on_standby
from gpulens.storage.reading import NotAvailableOnBackend, StoreReader
from gpulens.storage.sqlreader import SqlReader

log = logging.getLogger(__name__)
T = TypeVar("T")

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


@dataclass(frozen=True)
class RoundReads:
    """What a round reads for a set of rules: the union of their catalogue plans (``RoundPlan``): of every GPU its
    ``fields``, set slowdown ``reasons`` and (``xids``) XID counts, the ``facts`` the round fields are weighed
    against; and whether the RDMA ports, the hosts, the NCCL views, the hung drivers and the nodes' hardware are
    read."""

    fields: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    xids: bool = False
    facts: tuple[str, ...] = ()
    ports: bool = True
    hosts: bool = True
    nccl: bool = True
    hung: bool = True
    hardware: bool = True
    inspector: bool = True


EVERYTHING: Final = RoundReads()  # a round for rules nobody listed (the rules of a config, user rules included)


def round_reads(rules: Iterable[AlertRule]) -> RoundReads:
    """What ``rules`` read each round (their catalogue plans, merged; a user rule reads the GPUs whole)."""
    plans = [entry.round for rule in rules if (entry := definition(rule)) is not None]

    def union(name: str) -> tuple[str, ...]:
        return tuple(sorted({item for plan in plans for item in getattr(plan, name)}))

    return RoundReads(
        union("fields"),
        union("reasons"),
        any(p.xids for p in plans),
        union("facts"),
        ports=any(p.ports for p in plans),
        hosts=any(p.hosts for p in plans),
        nccl=any(p.nccl for p in plans),
        hung=any(p.hung for p in plans),
        hardware=any(p.hardware for p in plans),
        inspector=any(p.inspector for p in plans),
    )


def _or_none(read: Callable[[], T], empty: T) -> T:
    try:
        return read()
    except NotAvailableOnBackend:
        return empty


def store_round(store: StoreReader, now: float, *, max_age_s: float, reads: RoundReads = EVERYTHING) -> RoundResult:
    """The cluster now, as one round: GPUs with a reading newer than ``max_age_s``, their jobs and processes, and
    as ``reads`` asks the RDMA ports, the hosts and each node's NCCL view."""
    readings = store.latest_readings(max_age_s=max_age_s)
    jobs = store.current_jobs()
    processes: list[ProcessReading] = _or_none(lambda: store.current_processes(), [])
    return assemble_round(
        store.backend,
        now,
        readings,
        jobs,
        processes,
        store.target_health(),
        fabric_reads(store, max_age_s=max_age_s, reads=reads),
    )


@dataclass(frozen=True)
class FabricRound:
    """The round's RDMA ports, hosts, jobs' host shares and NCCL views (by node), where read."""

    nics: Sequence[NicReading] = ()
    hosts: Sequence[HostReading] = ()
    job_hosts: Sequence[JobHostReading] = ()
    nccl: Mapping[str, NcclView] = field(default_factory=dict)
    hung: Mapping[str, float] = field(default_factory=dict)  # node -> since when its NVML is hung
    # node -> its hardware against what it should be, and its driver version
    hardware: Mapping[str, tuple[NodeHardware, str | None]] = field(default_factory=dict)
    inspector: Mapping[str, InspectorView] = field(default_factory=dict)  # node -> NCCL Inspector's bandwidths


def fabric_reads(store: StoreReader, *, max_age_s: float, reads: RoundReads) -> FabricRound:
    """What ``reads`` asks of the cluster beyond its GPUs (a store that cannot serve a read gives none)."""
    return FabricRound(
        _or_none(lambda: store.latest_nics(max_age_s=max_age_s, newest_rates=True), []) if reads.ports else [],
        _or_none(store.latest_hosts, []) if reads.hosts else [],
        _or_none(store.latest_job_hosts, []) if reads.hosts else [],
        _or_none(lambda: store.latest_nccl(max_age_s=max_age_s), {}) if reads.nccl else {},
        _or_none(lambda: store.hung_nodes(max_age_s=max_age_s), {}) if reads.hung else {},
        _or_none(store.latest_hardware, {}) if reads.hardware else {},
        _or_none(lambda: store.latest_inspector(max_age_s=max_age_s), {}) if reads.inspector else {},
    )


def assemble_round(
    source: str,
    now: float,
    readings: Sequence[GpuReading],
    jobs: Sequence[GpuJob],
    processes: Sequence[ProcessReading],
    targets: Sequence[TargetHealth],
    fabric: FabricRound | None = None,
) -> RoundResult:
    """One ``RoundResult`` of what a store gave: a snapshot per node that has readings (GPUs, or RDMA ports), with
    its stored hardware and driver version where the store keeps them."""
    fabric = fabric or FabricRound()
    gpus: dict[str, list[GpuReading]] = defaultdict(list)
    for r in readings:
        gpus[r.node].append(r)
    node_jobs: dict[str, list[GpuJob]] = defaultdict(list)
    for j in jobs:
        node_jobs[j.node].append(j)
    node_processes: dict[str, list[ProcessReading]] = defaultdict(list)
    for p in processes:
        node_processes[p.node].append(p)
    nics: dict[str, list[NicReading]] = defaultdict(list)
    for n in fabric.nics:
        nics[n.node].append(n)
    hosts = {h.node: h for h in fabric.hosts}
    job_hosts: dict[str, list[JobHostReading]] = defaultdict(list)
    for share in fabric.job_hosts:
        job_hosts[share.node].append(share)
    snapshots = [
        NodeSnapshot(
            node=node,
            timestamp=max((r.timestamp for r in gpus[node]), default=now),
            source=source,
            gpus=tuple(gpus[node]),
            processes=tuple(node_processes[node]),
            jobs=tuple(node_jobs[node]),
            nics=tuple(nics[node]),
            host=hosts.get(node),
            job_hosts=tuple(job_hosts[node]),
            nccl=fabric.nccl.get(node),
            hardware=fabric.hardware.get(node, (None, None))[0],
            driver_version=fabric.hardware.get(node, (None, None))[1],
            nvml_hung_since=fabric.hung.get(node),
            inspector=fabric.inspector.get(node),
        )
        for node in sorted(set(gpus) | set(nics) | set(fabric.hung))
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
