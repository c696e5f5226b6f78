"""The collector: scrape every target on a schedule, write each round to SQL, spool it while the database is down.

One thread does all the writing (rounds, spool replay, rollups, retention), so SQLite always has a single writer;
scrapes run concurrently on a thread pool and each costs at most its own timeout. After each round, hooks run
(the alert engine is one) with what was scraped.

On PostgreSQL a round starts by checking the collector's role in its HA pair (``collector.pair``): a standby
scrapes and writes nothing, and runs no maintenance.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Final

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED, JobEvent
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpulens.clock import Clock, SystemClock
from gpulens.collector.pair import pair_leadership
from gpulens.collector.scrape import Scraper, ScrapeResult, merge_counts
from gpulens.collector.spool import Spool
from gpulens.collector.targets import TargetSet
from gpulens.logutil import LogOnce
from gpulens.rounds import RoundHook, RoundResult
from gpulens.settings import Settings
from gpulens.storage import jobsummary, remediationstore
from gpulens.storage.alertstore import outbox_backlog
from gpulens.storage.connect import SchemaBehindError, ensure_schema
from gpulens.storage.db import Database, DatabaseUnavailableError
from gpulens.storage.retention import Retention, RetentionJob
from gpulens.storage.rollup import Rollups
from gpulens.storage.writer import Writer, WriteStats

log = logging.getLogger(__name__)

RETENTION_EVERY_S = 3600.0
# Rollups and retention run in steps of about this long, between rounds, and stop this long before the next round is
# due: one step at most overruns, so they delay a round by well under 100 ms (storage/rollup.py, retention.py).
MAINTENANCE_STEP_S = 0.05
ACCOUNTING_EVERY_S = 60.0  # ended jobs are summarised (storage.jobsummary) at most this often
# the outbox backlog (gpulens_collector_outbox_*) and the remediation brake are read at most this often
OUTBOX_EVERY_S = 30.0
MAINTENANCE_MARGIN_S = 0.2


class CollectorMetrics:
    """The collector's own /metrics."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.scrape_duration = Gauge(
            "gpulens_collector_scrape_duration_seconds",
            "Duration of the last scrape of a target.",
            ["target"],
            registry=r,
        )
        self.target_up = Gauge(
            "gpulens_collector_target_up", "1 if the last scrape of a target succeeded.", ["target"], registry=r
        )
        self.targets = Gauge(
            "gpulens_collector_targets", "Targets by state after the last round.", ["state"], registry=r
        )
        self.round_duration = Histogram(
            "gpulens_collector_round_duration_seconds",
            "Duration of a scrape round (fetch, parse, write).",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
            registry=r,
        )
        self.rows = Counter("gpulens_collector_rows_written", "Rows written by table.", ["table"], registry=r)
        self.rejected = Counter(
            "gpulens_collector_rejected_samples", "Samples rejected by reason.", ["reason"], registry=r
        )
        self.scrape_failures = Counter(
            "gpulens_collector_scrape_failures", "Failed scrapes by target.", ["target"], registry=r
        )
        self.spool_depth = Gauge("gpulens_collector_spool_rounds", "Rounds waiting in the spool.", registry=r)
        self.spool_bytes = Gauge("gpulens_collector_spool_bytes", "Bytes waiting in the spool.", registry=r)
        self.spool_dropped = Counter(
            "gpulens_collector_spool_dropped_rounds", "Rounds dropped because the spool was full.", registry=r
        )
        self.db_up = Gauge("gpulens_collector_database_up", "1 if the last write reached the database.", registry=r)
        self.last_round = Gauge("gpulens_collector_last_round_timestamp_seconds", "End of the last round.", registry=r)
        self.interval = Gauge("gpulens_collector_interval_seconds", "The interval between rounds.", registry=r)
        self.outbox_pending = Gauge(
            "gpulens_collector_outbox_pending", "Notifications waiting in the outbox for delivery.", registry=r
        )
        self.outbox_age = Gauge(
            "gpulens_collector_outbox_oldest_pending_age_seconds",
            "How long the oldest notification waiting in the outbox has waited (0 when none waits).",
            registry=r,
        )
        self.remediation_halted = Gauge(
            "gpulens_collector_remediation_halted",
            "1 while the remediation brake halts every [[alerts.actions]] action (gpulens remediation resume).",
            registry=r,
        )
        self.rounds_skipped = Counter(
            "gpulens_collector_rounds_skipped",
            "Ticks at which no round started because the previous round was still running.",
            registry=r,
        )
        self.leader = Gauge(
            "gpulens_collector_leader",
            "1 if this collector is the active one of its HA pair (or runs alone), 0 on standby.",
            registry=r,
        )


# APScheduler's own lines about a skipped or missed run: the collector counts those ticks and logs the first itself.
_SCHEDULER_SKIP_LINES: Final = ("maximum number of running instances reached", "was missed by")


class _QuietSkips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not any(line in str(record.msg) for line in _SCHEDULER_SKIP_LINES)


_QUIET_SKIPS: Final = _QuietSkips()


class Collector:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        *,
        clock: Clock | None = None,
        scraper: Scraper | None = None,
        hooks: Sequence[RoundHook] = (),
        schema_ready: bool = True,
        migrate: bool = False,
    ) -> None:
        """``schema_ready=False``: the database was down at start-up; check its schema before the first write (and
        migrate it there only with ``migrate``, as at start-up)."""
        self._settings = settings
        self._schema_ready = schema_ready
        self._migrate = migrate
        self._db = db
        self._clock = clock or SystemClock()
        self._scraper = scraper or Scraper(
            timeout_s=settings.timeout_s,
            max_bytes=settings.max_response_bytes,
            future_tolerance_s=settings.future_tolerance_s,
            concurrency=settings.concurrency,
            clock=self._clock,
        )
        self._targets = TargetSet(settings)
        self._writer = Writer(db)
        self._rollups = Rollups(db)
        self._retention = Retention(
            raw_s=settings.retention_raw_s, minute_s=settings.retention_minute_s, hour_s=settings.retention_hour_s
        )
        self._spool = Spool(settings.spool_dir, max_bytes=settings.spool_max_bytes)
        self._hooks = list(hooks)
        self._log_once = LogOnce(log)
        self._db_down_since: float | None = None
        self._retention_job = RetentionJob(db, self._retention, every_s=RETENTION_EVERY_S)
        self._lock = threading.Lock()  # one round at a time, whoever calls
        self.metrics = CollectorMetrics()
        self.metrics.interval.set(settings.interval_s)
        self._outbox_read_at = float("-inf")
        self._reported_dropped = 0
        self._late = threading.Event()  # a tick came while a round was running: run the next one at once
        self._accounted_at = float("-inf")  # when ended jobs were last summarised (storage.jobsummary)
        self._leadership = pair_leadership(db, settings)

    def target_count(self) -> int:
        """How many targets the next round scrapes (static and discovered, this shard's)."""
        return len(self._targets.current())

    def add_hook(self, hook: RoundHook) -> None:
        self._hooks.append(hook)

    @property
    def spool(self) -> Spool:
        return self._spool

    # -- one round ------------------------------------------------------------------------------------------------

    def run_round(self) -> RoundResult:
        with self._lock:
            started = time.perf_counter()
            now = self._clock.now()
            if not self._active():
                result = RoundResult(time=now, snapshots=[], targets=[], leading=False)
            else:
                targets = self._targets.current()
                results = self._scraper.scrape_all(targets)
                if self._scraper.aborted:  # stopping mid-round: the targets did not fail, we left; store nothing
                    log.info("round cut short by shutdown: not stored")
                    return RoundResult(time=now, snapshots=[], targets=[])
                result = self._assemble(now, results)
                self._store(result)
                result.duration_s = time.perf_counter() - started
                self._observe(result)
        for hook in self._hooks:
            try:
                hook(result)
            except Exception:
                log.exception("a post-round hook failed")
        if result.leading:
            with self._lock:  # after the round and its hooks, in the time left before the next one
                self._maintain(now, until=started + self._settings.interval_s - MAINTENANCE_MARGIN_S)
        return result

    def _active(self) -> bool:
        """This round's role in the HA pair: active (scrape and write) or standby (nothing). While the database is
        unreachable the role is unknown: an active collector (or one just started) scrapes and spools, a standby
        stays one."""
        was = self._leadership.active
        active = self._leadership.check()
        if active is None:
            active = was is not False
        elif active and was is False:
            self._writer.forget()  # the other collector wrote meanwhile: what this one remembers is stale
        self.metrics.leader.set(1 if active else 0)
        return active

    def _assemble(self, now: float, results: list[ScrapeResult]) -> RoundResult:
        round_ = RoundResult(time=now, snapshots=[], targets=[])
        owners: dict[str, str] = {}
        node_owners: dict[str, str] = {}
        for r in results:
            merge_counts(round_.rejected, r.rejected)
            for reason in r.rejected:  # counted every round, told once per target and reason
                self._log_once(
                    f"rejected:{r.target.name}:{reason}", "target %s: values rejected (%s)", r.target.name, reason
                )
            health = r.health
            snapshot = r.snapshot
            if snapshot is not None and node_owners.setdefault(snapshot.node, r.target.name) != r.target.name:
                # Two targets claim one node (a shared Hostname label, say): an error the operator sees, not a merge.
                error = f"node {snapshot.node} is already scraped from target {node_owners[snapshot.node]}"
                health = dataclasses.replace(health, up=False, last_error=error, samples=0)
                snapshot = None
            if snapshot is not None:
                duplicates = [
                    g.uuid for g in snapshot.gpus if owners.setdefault(g.uuid, r.target.name) != r.target.name
                ]
                if duplicates:
                    # The same GPU from two targets (a mis-typed target list): the first target keeps it.
                    merge_counts(round_.rejected, {"duplicate_gpu": len(duplicates)})
                    dup = set(duplicates)
                    snapshot = snapshot.replace(
                        gpus=tuple(g for g in snapshot.gpus if g.uuid not in dup),
                        links=tuple(x for x in snapshot.links if x.uuid not in dup),
                        processes=tuple(x for x in snapshot.processes if x.uuid not in dup),
                        jobs=tuple(x for x in snapshot.jobs if x.uuid not in dup),
                        migs=tuple(x for x in snapshot.migs if x.uuid not in dup),
                    )
                round_.snapshots.append(snapshot)
            else:
                self._log_once(f"down:{r.target.name}", "target %s is down: %s", r.target.name, health.last_error)
            round_.targets.append(health)
        return round_

    def _store(self, result: RoundResult) -> None:
        try:
            self._ensure_schema()
            result.replayed = self._replay()
            stats = self._writer.write(result.snapshots, result.targets)
        except DatabaseUnavailableError as exc:
            self._spool.append(result.snapshots, result.targets)
            result.spooled = True
            if self._db_down_since is None:
                self._db_down_since = result.time
                log.error("database unreachable (%s); spooling rounds to %s", exc, self._settings.spool_dir)
            self.metrics.db_up.set(0)
            return
        if self._db_down_since is not None:
            log.warning(
                "database reachable again after %.0fs; spool replayed (%d rounds)",
                result.time - self._db_down_since,
                result.replayed,
            )
            self._db_down_since = None
        result.written = True
        self.metrics.db_up.set(1)
        self._count_rows(stats)
        if stats.isolated:  # snapshots the database refused (logged once by the writer): the rest are stored
            merge_counts(result.rejected, {"unwritable_snapshot": len(stats.isolated)})

    def _count_rows(self, stats: WriteStats) -> None:
        for table, rows in (
            ("gpu_sample", stats.gpu_rows),
            ("process", stats.process_rows),
            ("link", stats.link_rows),
            ("job", stats.job_rows),
            ("target", stats.target_rows),
            ("nic_sample", stats.nic_rows),
            ("host_sample", stats.host_rows),
            ("job_host_sample", stats.job_host_rows),
        ):
            if rows:
                self.metrics.rows.labels(table).inc(rows)

    def _ensure_schema(self) -> None:
        """The schema check that start-up could not make (the database was down then). A schema behind this code
        without ``--migrate`` keeps the rounds spooled, as a database that is down does, until it is upgraded."""
        if self._schema_ready:
            return
        try:
            ensure_schema(self._db, migrate=self._migrate)
        except SchemaBehindError as exc:
            raise DatabaseUnavailableError(exc.message) from None
        self._schema_ready = True
        log.warning("database %s reachable: schema checked", self._db.url_redacted)

    def _replay(self) -> int:
        """Write spooled rounds, oldest first. Raises DatabaseUnavailableError if the database goes away again."""
        replayed = 0
        for path in self._spool.pending():
            try:
                spooled = self._spool.load(path)
            except ValueError as exc:
                log.error("%s; set aside", exc)
                self._spool.set_aside(path)
                continue
            stats = self._writer.write(spooled.snapshots, spooled.targets)
            self._spool.remove(path)
            self._count_rows(stats)  # replayed rows are written rows too
            replayed += 1
        return replayed

    def _maintain(self, now: float, *, until: float) -> None:
        """Rollups, then retention, one short step at a time while work is pending and time is left."""
        if self._db_down_since is not None:
            return
        try:
            while time.perf_counter() + MAINTENANCE_STEP_S < until:
                pending = self._rollups.step(now, max_seconds=MAINTENANCE_STEP_S)
                if not pending:
                    pending = self._retention_job.step(now, max_seconds=MAINTENANCE_STEP_S)
                if not pending:
                    break
            if now - self._accounted_at >= ACCOUNTING_EVERY_S and time.perf_counter() + MAINTENANCE_STEP_S < until:
                self._accounted_at = now
                jobsummary.account_ended(self._db, self._settings.prices, now=now)
            if now - self._outbox_read_at >= OUTBOX_EVERY_S:
                self._outbox_read_at = now
                waiting, age = outbox_backlog(self._db, now)
                self.metrics.outbox_pending.set(waiting)
                self.metrics.outbox_age.set(age)
                self.metrics.remediation_halted.set(remediationstore.current_halt(self._db) is not None)
        except DatabaseUnavailableError as exc:
            self._log_once("maintenance-db-down", "rollups/retention postponed: %s", exc)

    def _observe(self, result: RoundResult) -> None:
        m = self.metrics
        up = 0
        for health in result.targets:
            m.target_up.labels(health.target).set(1 if health.up else 0)
            if health.scrape_duration_seconds is not None:
                m.scrape_duration.labels(health.target).set(health.scrape_duration_seconds)
            if health.up:
                up += 1
            else:
                m.scrape_failures.labels(health.target).inc()
        m.targets.labels("up").set(up)
        m.targets.labels("down").set(len(result.targets) - up)
        for reason, count in result.rejected.items():
            m.rejected.labels(reason).inc(count)
        m.round_duration.observe(result.duration_s)
        m.spool_depth.set(self._spool.depth)
        m.spool_bytes.set(self._spool.size_bytes)
        if self._spool.dropped_rounds > self._reported_dropped:
            m.spool_dropped.inc(self._spool.dropped_rounds - self._reported_dropped)
            self._reported_dropped = self._spool.dropped_rounds
        m.last_round.set(self._clock.now())

    # -- schedule -------------------------------------------------------------------------------------------------

    def run(self, stop: threading.Event, *, on_round: RoundHook | None = None) -> None:
        """Run rounds every interval until ``stop`` is set (APScheduler; a slow round delays, never overlaps).

        A tick that comes while a round is still running is skipped: counted in
        ``gpulens_collector_rounds_skipped_total``, logged the first time, and made up by starting the next round as
        soon as the late one ends, so a slow target or write does not cost the other targets their samples."""
        for name in ("apscheduler.scheduler", "apscheduler.executors.default"):
            logger = logging.getLogger(name)
            if _QUIET_SKIPS not in logger.filters:
                logger.addFilter(_QUIET_SKIPS)
        scheduler = BackgroundScheduler(timezone="UTC")

        def job() -> None:
            while True:
                self._late.clear()
                result = self.run_round()
                if on_round is not None:
                    on_round(result)
                if stop.is_set() or not self._late.is_set():
                    return

        scheduler.add_job(
            job,
            IntervalTrigger(seconds=self._settings.interval_s),
            id="scrape-round",
            max_instances=1,
            coalesce=True,
            misfire_grace_time=max(1, int(self._settings.interval_s)),
            next_run_time=None,
        )
        scheduler.add_listener(self._skipped, EVENT_JOB_MAX_INSTANCES | EVENT_JOB_MISSED)
        scheduler.start()
        try:
            scheduler.modify_job("scrape-round", next_run_time=datetime.now(UTC))
            while not stop.wait(0.5):
                pass
        finally:
            self._scraper.abort()  # a round in flight ends now, not at its slowest target's timeout
            scheduler.shutdown(wait=True)

    def _skipped(self, event: JobEvent) -> None:
        """A tick at which no round started (the previous one was still running)."""
        self.metrics.rounds_skipped.inc()
        self._late.set()
        self._log_once(
            "round-skipped",
            "a round ran past the %gs interval, so the next tick was skipped and the round runs once the late one "
            "ends (a slow target or database write; scrape timeout %gs); skipped ticks are counted in "
            "gpulens_collector_rounds_skipped_total",
            self._settings.interval_s,
            self._settings.timeout_s,
        )

    def close(self) -> None:
        """Close the scraper and give up the pair's lock (close the hooks first: the standby may take over now)."""
        self._scraper.close()
        self._leadership.release()
