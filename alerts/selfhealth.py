"""gpulens's own health as Prometheus alerting rules: the group ``gpulens-self`` of ``gpulens rules export``.

The collector and the exporters watch the GPUs; these rules watch them, over their self-metrics (docs/metrics.md,
"Self-metrics"): a collector that Prometheus cannot scrape, rounds that come late or are not written, a spool that
grows or drops rounds, notifications that wait in the outbox, and an exporter whose collections fail. They exist only
in Prometheus: a collector cannot be trusted to report that it is itself late.

Counters whose series appear with their first event (``gpulens_exporter_collect_errors_total{reason}``) are read as
"grew in the window, or appeared in it on a target scraped before it" (``unless ... offset`` and ``up offset``), so
the first error fires too, and a target Prometheus has just begun to scrape does not; unlabelled counters
(``gpulens_collector_spool_dropped_rounds_total``, ``_rounds_skipped_total``) are exported at 0 from the start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from gpulens.storage.prometheus.targets import watched_up

COLLECTOR_JOBS: Final = "gpulens-collector"  # the shipped config's job name (deploy/prometheus/prometheus.yml)
COLLECTOR_FAMILIES: Final = ("gpulens_collector_last_round_timestamp_seconds",)
LATE_INTERVALS: Final = 3  # a round is late once this many intervals have passed without one
OUTBOX_AGE_S: Final = 600  # a notification undelivered this long is a backlog
WINDOW: Final = "10m"  # the window of the counter rules
_ERRORS: Final = "gpulens_exporter_collect_errors_total"
_INSTANCE: Final = "{{ $labels.instance }}"


@dataclass(frozen=True)
class SelfRule:
    """One self-health alert, as Prometheus reads it."""

    name: str
    severity: str
    expr: str
    for_: str
    summary: str
    description: str
    runbook: str

    def entry(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"alert": self.name, "expr": self.expr}
        if self.for_:
            entry["for"] = self.for_
        entry["labels"] = {"severity": self.severity}
        entry["annotations"] = {"summary": self.summary, "description": self.description, "runbook": self.runbook}
        return entry


SELF_RULES: Final = (
    SelfRule(
        "GpulensCollectorDown",
        "critical",
        watched_up("up == 0", COLLECTOR_FAMILIES, COLLECTOR_JOBS),
        "2m",
        f"GpulensCollectorDown: Prometheus cannot scrape the collector at {_INSTANCE}.",
        "The collector's /metrics does not answer: the collector process, its host or the network is down, and no "
        "round is stored or alerted on.",
        "systemctl status gpulens-collector and its journal; check the listen address (collector.listen).",
    ),
    SelfRule(
        "GpulensCollectorRoundsLate",
        "warning",
        "time() - gpulens_collector_last_round_timestamp_seconds "
        f"> {LATE_INTERVALS} * gpulens_collector_interval_seconds "
        f"or increase(gpulens_collector_rounds_skipped_total[{WINDOW}]) > 0",
        "5m",
        f"GpulensCollectorRoundsLate: the collector at {_INSTANCE} runs its rounds late.",
        f"No round ended for {LATE_INTERVALS} intervals, or rounds ran past the interval and ticks were skipped in the "
        f"last {WINDOW}: samples are missing from the history.",
        "A slow target or database write: the collector's log names it; see docs/operations.md (sizing, shards).",
    ),
    SelfRule(
        "GpulensCollectorRoundsFailing",
        "critical",
        "gpulens_collector_database_up == 0 "
        'or gpulens_collector_targets{state="up"} == 0 and ignoring(state) gpulens_collector_targets{state="down"} > 0',
        "5m",
        f"GpulensCollectorRoundsFailing: the collector at {_INSTANCE} stores no round.",
        "The database refuses the rounds (they are spooled to disk), or no target of the collector answers.",
        "The collector's log says which; `gpulens query targets` lists the targets and their last errors.",
    ),
    SelfRule(
        "GpulensSpoolGrowing",
        "warning",
        f"deriv(gpulens_collector_spool_bytes[{WINDOW}]) > 0 and gpulens_collector_spool_bytes > 0",
        "10m",
        f"GpulensSpoolGrowing: the collector at {_INSTANCE} spools rounds to disk.",
        "The database has been unreachable and the on-disk spool keeps growing; once full it drops rounds.",
        "Bring the database back: the spool is replayed in order. See docs/operations.md (the spool).",
    ),
    SelfRule(
        "GpulensSpoolDroppingRounds",
        "critical",
        f"increase(gpulens_collector_spool_dropped_rounds_total[{WINDOW}]) > 0",
        "",
        f"GpulensSpoolDroppingRounds: the collector at {_INSTANCE} drops rounds: its spool is full.",
        "Rounds are lost for good: the database is down and the spool reached collector.spool_max_bytes.",
        "Bring the database back, or raise collector.spool_max_bytes if the disk allows.",
    ),
    SelfRule(
        "GpulensOutboxBacklog",
        "warning",
        f"gpulens_collector_outbox_oldest_pending_age_seconds > {OUTBOX_AGE_S}",
        "5m",
        f"GpulensOutboxBacklog: {{{{ $value | humanizeDuration }}}} old notifications wait in the outbox "
        f"({_INSTANCE}).",
        f"A notification has waited over {OUTBOX_AGE_S // 60} minutes for delivery: a receiver (Slack, a webhook) "
        "refuses or does not answer, so alerts reach nobody.",
        "The collector's log names the receiver and its error; `gpulens alerts test-notify RECEIVER` tries it now.",
    ),
    SelfRule(
        "GpulensRemediationHalted",
        "critical",
        "gpulens_collector_remediation_halted == 1",
        "",
        f"GpulensRemediationHalted: the remediation brake halts every action ({_INSTANCE}).",
        "More than breaker_nodes of the nodes were to be drained within breaker_window: a fault of many nodes at "
        "once (a switch, a driver rollout), so gpulens drains nothing more until a person lifts the halt.",
        "gpulens remediation list shows the nodes and decisions behind it; find the shared cause, then "
        "gpulens remediation resume (docs/remediation.md).",
    ),
    SelfRule(
        "GpulensExporterCollectionErrors",
        "warning",
        f"increase({_ERRORS}[{WINDOW}]) > 0 "
        f"or ({_ERRORS} unless {_ERRORS} offset {WINDOW}) and on(job, instance) (up offset {WINDOW})",
        "",
        f"GpulensExporterCollectionErrors: the exporter at {_INSTANCE} fails to collect ({{{{ $labels.reason }}}}).",
        f"The exporter counted collection failures of this reason in the last {WINDOW}: some of its GPU readings are "
        "missing or stale.",
        "The exporter's log names the first failure of each reason; check NVML (nvidia-smi) or the dcgm-exporter.",
    ),
)


def self_health_group(name: str = "gpulens-self") -> dict[str, Any]:
    """The self-health rules as one Prometheus rule group."""
    return {"name": name, "rules": [rule.entry() for rule in SELF_RULES]}
