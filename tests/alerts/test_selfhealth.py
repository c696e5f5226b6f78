"""The self-health rules under ``promtool test rules``: each fires on a synthetic series of its trouble and stays quiet
on a healthy one, as the exported file (the shipped one) says."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from gpulens.alerts.promexport import prometheus_rules_yaml
from gpulens.alerts.rules import builtin_rules
from gpulens.alerts.selfhealth import SELF_RULES, SelfRule

SICK = {"job": "gpulens-collector", "instance": "central-1:9411"}
WELL = {"job": "gpulens-collector", "instance": "central-2:9411"}
NODE_SICK = {"job": "gpu-fleet", "instance": "gpu-07:9410"}
NODE_WELL = {"job": "gpu-fleet", "instance": "gpu-08:9410"}


def _series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    pairs = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{pairs}}}", "values": values}


def _both(name: str, sick: str, well: str, **extra: str) -> list[dict[str, str]]:
    return [_series(name, {**SICK, **extra}, sick), _series(name, {**WELL, **extra}, well)]


# One sample a minute; ``1x20`` is 21 samples (minutes 0-20). The sick collector: its database goes away after minute
# 10 and its spool grows from then on, its outbox ages from minute 11, its rounds stop after minute 20 (the last round
# stays stamped 1200 s) and so does its scrape, its spool drops rounds from minute 26. The well one does everything
# right. The sick one's remediation brake halts from minute 16. An exporter's NVML reads fail from minute 16: its
# reason's series appears with its first error; another exporter has counted 3 errors since before Prometheus began
# (quiet: the count does not grow). A node exporter is down.
SERIES: list[dict[str, str]] = [
    *_both("up", "1x20 0x20", "1x40"),
    *_both("gpulens_collector_last_round_timestamp_seconds", "0+60x20 1200x20", "0+60x40"),
    *_both("gpulens_collector_interval_seconds", "10x40", "10x40"),
    *_both("gpulens_collector_rounds_skipped_total", "0x40", "0x40"),
    *_both("gpulens_collector_database_up", "1x10 0x30", "1x40"),
    *_both("gpulens_collector_targets", "5x40", "5x40", state="up"),
    *_both("gpulens_collector_targets", "0x40", "0x40", state="down"),
    *_both("gpulens_collector_spool_bytes", "0x10 0+1e6x30", "0x40"),
    *_both("gpulens_collector_spool_dropped_rounds_total", "0x25 1+1x15", "0x40"),
    *_both("gpulens_collector_outbox_oldest_pending_age_seconds", "0x10 0+60x30", "0x40"),
    *_both("gpulens_collector_remediation_halted", "0x15 1x25", "0x40"),
    _series("up", {"job": "node", "instance": "db-1:9100"}, "0x40"),
    _series("up", NODE_SICK, "1x40"),
    _series("up", NODE_WELL, "1x40"),
    _series("gpulens_exporter_collect_errors_total", {**NODE_SICK, "reason": "nvml_timeout"}, "_x15 1+1x25"),
    _series("gpulens_exporter_collect_errors_total", {**NODE_WELL, "reason": "nvml_timeout"}, "3x40"),
]
ERRORS = {**NODE_SICK, "reason": "nvml_timeout"}


def _summary(rule: SelfRule, labels: dict[str, str]) -> str:
    """The summary as Prometheus renders it for ``labels`` (the outbox's only firing value: 1,260 s at minute 32)."""
    text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], rule.summary)
    return text.replace("{{ $value | humanizeDuration }}", "21m 0s")


def _alerts(eval_time: str, firing: dict[str, list[dict[str, str]]]) -> list[dict[str, Any]]:
    """Every self-health rule at ``eval_time``: those in ``firing`` with exactly these labels (and their complete
    annotations), the rest none."""
    return [
        {
            "eval_time": eval_time,
            "alertname": r.name,
            "exp_alerts": [
                {
                    "exp_labels": {"severity": r.severity, **x},
                    "exp_annotations": {"summary": _summary(r, x), "description": r.description, "runbook": r.runbook},
                }
                for x in firing.get(r.name, [])
            ],
        }
        for r in SELF_RULES
    ]


def test_each_self_health_rule_fires_on_its_trouble_only(promtool: str, tmp_path: Path) -> None:
    (tmp_path / "rules.yml").write_text(prometheus_rules_yaml(builtin_rules()))
    cases = [
        # minute 5: Prometheus began 5 minutes ago; the exporter's 3 old errors are not new ones
        *_alerts("5m", {}),
        # minute 12: the database has been down 1 minute (for 5m), the spool grown 1 (for 10m): all quiet
        *_alerts("12m", {}),
        # minute 19: rounds not stored for 8 minutes; the spool has grown for 7 (pending), the outbox's oldest has
        # waited 480 s (under 600); the exporter's first errors (its series appeared at 16)
        *_alerts(
            "19m",
            {
                "GpulensCollectorRoundsFailing": [SICK],
                "GpulensExporterCollectionErrors": [ERRORS],
                "GpulensRemediationHalted": [SICK],  # halted since minute 16, at once
            },
        ),
        *_alerts(
            "32m",
            {
                "GpulensCollectorDown": [SICK],  # not scraped since 21, for 2m
                "GpulensCollectorRoundsLate": [SICK],  # no round since 20 (over 3 x 10 s), for 5m
                "GpulensCollectorRoundsFailing": [SICK],
                "GpulensSpoolGrowing": [SICK],
                "GpulensSpoolDroppingRounds": [SICK],
                "GpulensOutboxBacklog": [SICK],  # over 600 s from 22, for 5m
                "GpulensRemediationHalted": [SICK],
                "GpulensExporterCollectionErrors": [ERRORS],
            },
        ),
    ]
    test = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": SERIES, "alert_rule_test": cases}],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test, sort_keys=False, width=1000))
    result = subprocess.run(
        [promtool, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr
    assert {c["alertname"] for c in cases if c["exp_alerts"]} == {r.name for r in SELF_RULES}  # each one fires


def test_the_rules_read_only_families_the_collector_and_the_exporter_export() -> None:
    """A renamed family breaks this test, not the alert (which would then never fire)."""
    from prometheus_client import generate_latest

    from gpulens.collector.loop import CollectorMetrics
    from gpulens.exporter.metrics import ExporterHealth, render_metrics

    exported = generate_latest(CollectorMetrics().registry).decode()
    exported += render_metrics(None, ExporterHealth(collect_errors={"nvml_timeout": 1})).decode()
    lines = exported.splitlines()
    names = {ln.split("{")[0].split(" ")[0] for ln in lines if not ln.startswith("#")}
    names |= {ln.split(" ")[2] for ln in lines if ln.startswith("# TYPE ")}  # labelled, no series until the first round
    used = {n for r in SELF_RULES for n in re.findall(r"\bgpulens_\w+", r.expr)}
    assert used
    assert used <= names, used - names
