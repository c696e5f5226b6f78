"""``promtool test rules`` over the current export (``prometheus_rules_yaml(builtin_rules())``): for every exported
alerting rule, input series that make it fire (the alert and its exact labels, at an evaluation after its ``for``)
and a case that must not fire (no alert of the rule at all). Prometheus's own rule engine judges them.

Among them the cases the engine's checks (``alerts.checks``) decide and an export once missed: an XID series that
begins with its first event (the exporter emits a code's counter only once it has happened), a PCIe link trained at
half its width on an idle GPU, a slowdown for ``hw_slowdown`` alone, an uncorrectable-ECC counter present at 0 from
the first scrape (no event), a power cap held over a pause in the work, and NCCL RAS's dead rank and missing rank
(which also mute the utilisation signatures of their job). The last test checks ``ruleparity.prometheus_alerts``, the
parity test's copy of Prometheus's alert state machine, against promtool's at every evaluation.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from gpulens.alerts.promexport import prometheus_rules, prometheus_rules_yaml
from gpulens.alerts.rules import builtin_rules
from tests.alerts.promtoolcases import CASES, Case
from tests.alerts.ruleparity import exported_rules, prometheus_alerts


def _series_text(name: str, labels: Mapping[str, str]) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _unit_test(cases: Sequence[Case], rules_file: str) -> dict[str, Any]:
    """The promtool unit-test document: one test group per case (its own series), checking its rule's alerts."""
    rules = {r.name: r for r in builtin_rules()}
    groups = []
    for case in cases:
        rule = rules[case.rule]
        exp = [{"exp_labels": {"severity": rule.severity, **dict(rule.labels), **alert}} for alert in case.alerts]
        groups.append(
            {
                "name": f"{case.rule}: {case.what}",
                "interval": "1m",
                "input_series": [{"series": _series_text(n, ls), "values": v} for n, ls, v in case.series],
                "alert_rule_test": [{"eval_time": f"{case.at}m", "alertname": case.rule, "exp_alerts": exp}],
            }
        )
    return {"rule_files": [rules_file], "evaluation_interval": "1m", "tests": groups}


def _without_annotations(rules_yaml: str) -> str:
    """The exported rules file less its annotations (promtool compares an alert's annotations whole; these cases
    are about when and on what each rule fires: ``test_promexport`` checks the rendered annotations)."""
    document = yaml.safe_load(rules_yaml)
    for group in document["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    return yaml.safe_dump(document, sort_keys=False, width=1000)


def _promtool_test(promtool: str, where: Path, document: Mapping[str, Any]) -> subprocess.CompletedProcess[str]:
    (where / "test.yml").write_text(yaml.safe_dump(dict(document), sort_keys=False, width=1000))
    return subprocess.run(
        [promtool, "test", "rules", "test.yml"], cwd=where, capture_output=True, text=True, check=False
    )


def test_every_exported_rule_has_a_case_that_fires_it_and_one_that_must_not() -> None:
    exported = {r["alert"] for r in exported_rules(prometheus_rules(builtin_rules()))}
    fires = {c.rule for c in CASES if c.alerts}
    silent = {c.rule for c in CASES if not c.alerts}
    assert exported - fires == set()
    assert exported - silent == {"Watchdog"}  # it always fires
    signatures = {a.get("signature") for c in CASES for a in c.alerts if c.rule == "CommunicationStall"}
    assert signatures == {"spinning", "blocked", "mixed", "rank_dead", "rank_missing"}


@pytest.mark.parametrize("fires", [True, False], ids=["fires", "stays-silent"])
def test_promtool_runs_each_exported_rule_over_its_cases(promtool: str, tmp_path: Path, fires: bool) -> None:
    (tmp_path / "rules.yml").write_text(_without_annotations(prometheus_rules_yaml(builtin_rules())))
    result = _promtool_test(promtool, tmp_path, _unit_test([c for c in CASES if bool(c.alerts) == fires], "rules.yml"))
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]


# A rule whose expression returns the series while its value is above 0: promtool evaluates it over the patterns
# below, and ``prometheus_alerts`` must find the alerts firing at exactly the evaluations promtool does.
PATTERNS: Final = {
    "steady": [1] * 12,
    "a gap shorter than keep_firing_for": [1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0],
    "a gap longer than keep_firing_for": [1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0],
    "pending interrupted before for": [1, 1, 0, 1, 1, 0, 1, 1, 1, 1, 0, 0],
}


@pytest.mark.parametrize(("for_m", "keep_m"), [(0, 0), (2, 0), (2, 3), (0, 2)])
def test_the_parity_tests_alert_state_machine_agrees_with_prometheus(
    promtool: str, tmp_path: Path, for_m: int, keep_m: int
) -> None:
    rule: dict[str, Any] = {"alert": "Probe", "expr": "probe > 0"}
    if for_m:
        rule["for"] = f"{for_m}m"
    if keep_m:
        rule["keep_firing_for"] = f"{keep_m}m"
    (tmp_path / "probe.yml").write_text(yaml.safe_dump({"groups": [{"name": "probe", "rules": [rule]}]}))
    groups = []
    for name, pattern in PATTERNS.items():
        labels = frozenset({("pattern", name)})
        present = {60.0 * k: [labels] if v else [] for k, v in enumerate(pattern)}
        onsets = prometheus_alerts(present, 60.0 * for_m, 60.0 * keep_m).get(labels, [])
        firing = _firing_minutes(pattern, onsets, for_m, keep_m)
        groups.append(
            {
                "name": name,
                "interval": "1m",
                "input_series": [{"series": f'probe{{pattern="{name}"}}', "values": " ".join(map(str, pattern))}],
                "alert_rule_test": [
                    {
                        "eval_time": f"{k}m",
                        "alertname": "Probe",
                        "exp_alerts": [{"exp_labels": {"pattern": name}}] if k in firing else [],
                    }
                    for k in range(len(pattern))
                ],
            }
        )
    result = _promtool_test(
        promtool, tmp_path, {"rule_files": ["probe.yml"], "evaluation_interval": "1m", "tests": groups}
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]


def _firing_minutes(pattern: Sequence[int], onsets: Sequence[float], for_m: int, keep_m: int) -> set[int]:
    """The evaluations (minutes) at which the alert fires, from ``prometheus_alerts``'s onsets: from each onset
    while the expression returns the series, and ``keep_m`` minutes of evaluations past its last return."""
    firing: set[int] = set()
    for onset in onsets:
        k = round(onset / 60)
        missing_since: int | None = None
        while k < len(pattern):
            if pattern[k]:
                missing_since = None
            else:
                missing_since = k if missing_since is None else missing_since
                if k - missing_since >= keep_m:
                    break
            firing.add(k)
            k += 1
    return firing
