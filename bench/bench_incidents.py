"""Notifications per scenario: how many messages a Slack and a webhook receiver get over each example scenario, and
how many firing alerts reached no receiver (``unreported``). Two routings: ``by_alertname`` (no routes: every
receiver gets every alert, grouped by alertname, the default) and ``by_alert`` (a route per receiver grouping by
every label: each alert its own page). Slack and webhook receivers are told of incidents whatever the routing's
``group_by``, the incidents due at once in one message (``alerts.incidentnotify``); the webhook also gets the
Watchdog.

Runs each scenario as ``gpulens simulate`` does (the production path in virtual time), with the receivers
configured; prints ``incidents_<scenario>_<what>: <value> <unit>`` lines."""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

from bench import options

SCENARIOS = ("gpu-lost", "stall", "hangs", "demo", "faults", "fabric")
RECEIVERS = [
    {"name": "slack", "kind": "slack", "url_env": "SLACK_URL"},
    {"name": "hook", "kind": "webhook", "url_env": "HOOK_URL"},
]
ROUTINGS = {
    "by_alertname": {"receivers": RECEIVERS},
    "by_alert": {
        "receivers": RECEIVERS,
        "routes": [{"receiver": r["name"], "group_by": ["..."], "continue": True} for r in RECEIVERS],
    },
}


def run(path: Path, alerting: dict[str, object]) -> tuple[Counter[str], int, int]:
    """Messages by receiver, incidents, firing alerts in no notified incident."""
    from gpulens.alerts.config import parse_alerting
    from gpulens.alerts.replay import read_round
    from gpulens.alerts.service import AlertService
    from gpulens.collector.scrape import sanitize
    from gpulens.exporter.sim import SimCluster, load_scenario
    from gpulens.storage.connect import open_database
    from gpulens.storage.writer import Writer

    scenario = load_scenario(path)
    cluster = SimCluster(scenario)
    sent: Counter[str] = Counter()
    notified: set[str] = set()
    fired: set[str] = set()
    incidents: set[str] = set()
    with tempfile.TemporaryDirectory() as tmp:
        db = open_database(f"sqlite:///{Path(tmp) / 'b.db'}")
        try:
            writer = Writer(db)
            service = AlertService(db, parse_alerting(alerting), notifiers={})
            for k in range(int(scenario.duration_s // scenario.step_s)):
                t = scenario.start + k * scenario.step_s
                snapshots, targets = read_round(cluster, t)
                snapshots = [sanitize(s, t, 300.0)[0] for s in snapshots]
                writer.write(snapshots, targets)
                outcome = service.process(t, snapshots, targets)
                fired |= {s.fingerprint for s in outcome.result.states.values() if s.state == "firing"}
                for n in outcome.notifications:
                    sent[n.receiver] += 1
                    notified |= {a.fingerprint for a in n.alerts}
                    incidents |= {i["incident"] for i in n.incidents}
                    incident = n.group_labels.get("incident")
                    if incident:
                        incidents.add(incident)
                for inc in getattr(outcome, "incidents", {}).values():
                    incidents.add(inc.id)
                    if inc.notified is not None:
                        notified |= {m.fingerprint for m in inc.members}
        finally:
            db.close()
    return sent, len(incidents), len(fired - notified)


def main() -> None:
    options.no_arguments(__spec__.name if __spec__ else __name__, __doc__)
    here = Path(__file__).resolve().parent.parent / "examples" / "scenarios"
    for name in SCENARIOS:
        path = here / f"{name}.toml"
        key = name.replace("-", "_")
        for routing, alerting in ROUTINGS.items():
            sent, incidents, unreported = run(path, alerting)
            print(f"incidents_{key}_{routing}_slack_messages: {sent['slack']} messages", flush=True)
            print(f"incidents_{key}_{routing}_webhook_messages: {sent['hook']} messages", flush=True)
            print(f"incidents_{key}_{routing}_unreported_alerts: {unreported} alerts", flush=True)
        print(f"incidents_{key}_opened: {incidents} incidents", flush=True)


if __name__ == "__main__":
    main()
