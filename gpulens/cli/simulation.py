"""``gpulens simulate``: a scenario in virtual time through the production path, as fast as the CPU allows.

Each step reads every simulated node (the exporter's source code), checks the readings as the collector's ingest
does, writes them with the storage writer, and runs the alert engine with its state in SQL: the same code as a live
deployment, minus HTTP and the wall clock. Part of the CLI layer: it composes the packages, so it imports them
inside the function, like ``gpulens.cli``.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from gpulens.config import format_duration

if TYPE_CHECKING:
    from gpulens.alerts.config import AlertingConfig
    from gpulens.alerts.incidents import Incident


@dataclass(frozen=True)
class SimulateReport:
    alerts: list[dict[str, object]]  # FiredAlert.to_json() elements
    incidents: list[dict[str, object]]  # Incident.report() elements, in the order they opened
    table: str
    rounds: int
    gpus: int
    seconds: float
    db_url: str


def simulate(
    scenario_path: str | Path,
    *,
    db_url: str | None = None,
    rules_path: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
    alerting: AlertingConfig | None = None,
    environ: Mapping[str, str] | None = None,
) -> SimulateReport:
    """Run the scenario and report the alerts that fired. Raises ConfigError for a bad scenario or rules file.

    ``alerting``: receivers and routes to notify, each round's notifications delivered in that round (their secrets
    from ``environ``); by default nothing is sent."""
    from gpulens.alerts.config import AlertingConfig as Alerting
    from gpulens.alerts.config import load_rules_file
    from gpulens.alerts.replay import AlertTimeline, read_round, table
    from gpulens.alerts.rules import builtin_rules
    from gpulens.alerts.service import AlertService
    from gpulens.collector.scrape import sanitize
    from gpulens.exporter.sim import SimCluster, load_scenario
    from gpulens.storage.connect import open_database
    from gpulens.storage.writer import Writer

    scenario = load_scenario(scenario_path)
    rules = builtin_rules()
    if rules_path is not None:
        rules = [*rules, *load_rules_file(rules_path)]
    cluster = SimCluster(scenario)
    with tempfile.TemporaryDirectory(prefix="gpulens-simulate-") as tmp:
        url = db_url or f"sqlite:///{Path(tmp) / 'simulate.db'}"
        db = open_database(url)
        try:
            writer = Writer(db)
            config = Alerting(rules=tuple(rules)) if alerting is None else replace(alerting, rules=tuple(rules))
            service = AlertService(db, config, notifiers=None if alerting else {}, environ=environ)
            timeline = AlertTimeline()
            incidents: dict[str, Incident] = {}
            started = time.perf_counter()
            steps = int(scenario.duration_s // scenario.step_s)
            gpus = 0
            for k in range(steps):
                t = scenario.start + k * scenario.step_s
                snapshots, targets = read_round(cluster, t)
                snapshots = [sanitize(s, t, 300.0)[0] for s in snapshots]
                writer.write(snapshots, targets)
                outcome = service.process(t, snapshots, targets)
                timeline.observe(outcome.result)
                if alerting is not None:
                    service.deliver(t)
                gone = [key for key, i in incidents.items() if i.is_open and key not in outcome.incidents]
                for key in gone:  # merged into another: that one holds its alerts now
                    del incidents[key]
                incidents.update(outcome.incidents)
                gpus = max(gpus, sum(len(s.gpus) for s in snapshots))
                if progress is not None and k and k % max(1, steps // 10) == 0:
                    progress(
                        f"simulated {format_duration(k * scenario.step_s)} of "
                        f"{format_duration(scenario.duration_s)} ({len(timeline.alerts)} alerts so far)"
                    )
            elapsed = time.perf_counter() - started
        finally:
            db.close()
    return SimulateReport(
        alerts=[a.to_json() for a in timeline.alerts],
        incidents=[i.report() for i in sorted(incidents.values(), key=lambda i: (i.fired_at, i.id))],
        table=table(timeline.alerts, scenario.start),
        rounds=steps,
        gpus=gpus,
        seconds=elapsed,
        db_url=url if db_url else "(temporary)",
    )
