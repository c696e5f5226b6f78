"""A database filled from a simulated scenario, and the alerts the engine raised on it (for tests, screenshots and the
bench): the same simulator, writer and alert engine the collector runs, stepped through virtual time. Each node's
fabric, host and job cgroups are added to its snapshots by ``tests.dashboard.fabricdata``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from gpulens.alerts.catalogue import BUILTIN_RULES
from gpulens.alerts.engine import AlertEngine
from gpulens.alerts.incidents import Incident, open_incidents
from gpulens.alerts.matchers import Matcher
from gpulens.alerts.replay import rounds
from gpulens.alerts.state import AlertState, Silence
from gpulens.exporter.sim import SimCluster, load_scenario
from gpulens.storage.db import Database
from gpulens.storage.writer import Writer
from tests.dashboard.fabricdata import FabricWriter

SCENARIO: Final = Path(__file__).with_name("cluster.toml")
STALLED_JOB: Final = "llm-pretrain"
STRAGGLING_JOB: Final = "vision-finetune"
IDLE_JOB: Final = "reserved-eval"


@dataclass
class ReplayedAlerts:
    """The dashboard's ``AlertReader`` over what an alert engine decided while the scenario ran."""

    states: list[AlertState] = field(default_factory=list)
    episodes: list[AlertState] = field(default_factory=list)
    silenced: list[Silence] = field(default_factory=list)
    found: dict[str, Incident] = field(default_factory=dict)  # every incident, as the engine left it

    def open_incidents(self) -> Sequence[Incident]:
        return open_incidents(self.found)

    def incidents(self, since: float) -> Sequence[Incident]:
        return [i for i in self.found.values() if i.resolved_at is None or i.resolved_at >= since]

    def active(self) -> Sequence[AlertState]:
        return [s for s in self.states if s.state in ("pending", "firing")]

    def history(self, start: float, end: float) -> Sequence[AlertState]:
        return [e for e in self.episodes if e.active_since <= end and (e.resolved_at is None or e.resolved_at >= start)]

    def silences(self, now: float) -> Sequence[Silence]:
        return [s for s in self.silenced if s.ends_at > now]


@dataclass(frozen=True)
class Filled:
    start: float
    end: float  # the scenario's end: "now" for the dashboard
    alerts: ReplayedAlerts


def fill(db: Database, scenario: Path = SCENARIO) -> Filled:
    """Write every step of ``scenario`` to ``db`` (schema upgraded first) and run the built-in rules on it."""
    spec = load_scenario(scenario)
    cluster = SimCluster(spec)
    end = spec.start + spec.duration_s
    silence = Silence(
        id="1",
        matchers=(Matcher("alertname", "=", "GpuIdleAllocated"),),
        starts_at=spec.start + 50 * 60,
        ends_at=end + 3 * 3600,
        comment="reserved for the Friday evaluation run",
        created_by="dave",
    )
    engine = AlertEngine(BUILTIN_RULES, silences=lambda: [silence])
    db.upgrade()
    writer = Writer(db)
    episodes: dict[tuple[str, float], AlertState] = {}
    found: dict[str, Incident] = {}
    fabric = FabricWriter(spec.start)
    for t, read, targets in rounds(cluster, spec.start, end, spec.step_s):
        snapshots = [fabric.add(s) for s in read]
        writer.write(snapshots, targets)
        outcome = engine.process(t, snapshots, targets)
        for state in outcome.result.states.values():
            episodes[(state.fingerprint, state.active_since)] = state
        found = {k: i for k, i in found.items() if not i.is_open or k in outcome.incidents} | outcome.incidents
    alerts = ReplayedAlerts(list(engine.states.values()), list(episodes.values()), [silence], found)
    return Filled(spec.start, end - spec.step_s, alerts)
