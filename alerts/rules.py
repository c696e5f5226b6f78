"""Rule evaluation: pure functions of the rules, the history and ``now``.

``evaluate`` runs every rule on the latest round and returns the conditions that hold now (``Candidate``); the state
machine (``gpulens.alerts.state.step``) turns them into pending, firing and resolved alerts. ``builtin_rules`` is the
catalogue with the config's overrides applied.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Final

from gpulens.alerts.base import SEVERITIES, AlertRule, Candidate, Threshold
from gpulens.alerts.catalogue import BUILTIN_RULES, DEFINITIONS, EXPORTER_DOWN, GPU_LOST
from gpulens.alerts.definition import Check
from gpulens.alerts.history import History
from gpulens.alerts.userrules import THRESHOLD_CHECK, threshold_check
from gpulens.config import ConfigError, parse_duration

__all__ = ["CHECKS", "AlertRule", "Candidate", "builtin_rules", "data_missing", "evaluate", "required_window_s"]

# Each builtin's check, from its catalogue entry, and the user rules' threshold check
CHECKS: Final[Mapping[str, Check]] = {d.rule.name: d.check for d in DEFINITIONS} | {THRESHOLD_CHECK: threshold_check}


def evaluate(rules: Sequence[AlertRule], history: History, now: float) -> list[Candidate]:
    """Every rule's candidates on the history's latest round (pure: reads ``history``, changes nothing)."""
    out: list[Candidate] = []
    for rule in rules:
        found = CHECKS[rule.check or rule.name](rule, history, now)
        out.extend(with_job_nodes(found, history) if rule.scope == "job" else found)
    return out


def with_job_nodes(candidates: Sequence[Candidate], history: History) -> list[Candidate]:
    """A job alert's candidates labelled ``nodes``: the nodes of the job's GPUs this round, sorted, comma-joined
    (what a person needs to find the job's hosts; a check may have set it already)."""
    latest = history.latest
    if latest is None:
        return list(candidates)
    out = []
    for c in candidates:
        view = latest.jobs.get(c.labels.get("job_id", ""))
        if c.hold or view is None or "nodes" in c.labels:
            out.append(c)
            continue
        nodes = sorted({reading.node for uuid in view.gpus if (reading := latest.gpus.get(uuid)) is not None})
        out.append(replace(c, labels={**c.labels, "nodes": ",".join(nodes)}) if nodes else c)
    return out


def data_missing(history: History, rule: str, labels: Mapping[str, str]) -> bool:
    """No data this round to judge an alert on: its node did not answer, its GPU is lost, or the history holds a
    single reading of its GPU (just started or restarted: counters have nothing to compare with).

    The state machine keeps such alerts as they are instead of resolving them. ``ExporterDown`` is judged from the
    scrape itself and is never held; ``GpuLost`` is held only while its node does not answer.
    """
    if rule == EXPORTER_DOWN:
        return False
    node = labels.get("node")
    missing = history.missing_nodes()
    if node is not None and node in missing:
        return True
    if missing and any(n in missing for n in labels.get("nodes", "").split(",")):
        return True  # a job alert whose job spans a node that did not answer
    uuid = labels.get("uuid")
    if uuid is None or rule == GPU_LOST:
        return False
    latest = history.latest
    return uuid in history.lost_gpus() or (latest is not None and history.first_seen(uuid) == latest.time)


def required_window_s(rules: Sequence[AlertRule], minimum: float = 1800.0) -> float:
    """A history window long enough for every rule's lookback (``window_s`` thresholds)."""
    lookbacks = [float(v) for r in rules for k, v in r.thresholds.items() if k == "window_s" and isinstance(v, float)]
    return max([minimum, *lookbacks])


# ------------------------------------------------------------------------------------------------ overrides

_RULE_KEYS: Final = ("for", "keep_firing_for", "severity", "enabled", "labels", "runbook_url", "annotations")
# Annotations the engine writes for every alert, which an override cannot replace.
_COMPUTED_ANNOTATIONS: Final = ("summary", "description", "dashboard")


def builtin_rules(overrides: Mapping[str, Mapping[str, Any]] | None = None) -> list[AlertRule]:
    """The builtin catalogue with ``overrides`` (``[alerts.builtin.<Name>]`` tables) applied.

    An override may set ``for``, ``keep_firing_for``, ``severity``, ``enabled = false``, extra ``labels``, the site's
    ``runbook_url`` and extra ``annotations`` (both carried by every alert of the rule and by its exported Prometheus
    rules; neither changes an alert's identity), and any of the rule's thresholds. Raises ``ConfigError`` with the
    dotted key of the first bad entry.
    """
    overrides = overrides or {}
    known = {rule.name: rule for rule in BUILTIN_RULES}
    for name in overrides:
        if name not in known:
            raise ConfigError(f"unknown builtin rule (the catalogue has {', '.join(known)})", key=_key(name))
    rules = []
    for rule in BUILTIN_RULES:
        table = overrides.get(rule.name)
        if table is None:
            rules.append(rule)
            continue
        if not isinstance(table, Mapping):
            raise ConfigError("expected a table", key=_key(rule.name))
        if table.get("enabled", True) is False:
            continue
        rules.append(_override(rule, table))
    return rules


def _key(name: str, key: str | None = None) -> str:
    return f"alerts.builtin.{name}" + (f".{key}" if key else "")


def _override(rule: AlertRule, table: Mapping[str, Any]) -> AlertRule:
    changes: dict[str, Any] = {}
    thresholds: dict[str, Threshold] = dict(rule.thresholds)
    annotations: dict[str, str] = dict(rule.annotations)
    for key, value in table.items():
        where = _key(rule.name, key)
        if key in ("for", "keep_firing_for"):
            changes[f"{key}_s"] = _duration(value, where)
        elif key == "severity":
            if value not in SEVERITIES:
                raise ConfigError(f"expected one of {', '.join(SEVERITIES)}, got {value!r:.40}", key=where)
            changes["severity"] = value
        elif key == "enabled":
            if not isinstance(value, bool):
                raise ConfigError(f"expected true or false, got {value!r:.40}", key=where)
        elif key == "labels":
            changes["labels"] = _labels(value, where)
        elif key == "annotations":
            annotations.update(_annotations(value, where))
        elif key == "runbook_url":
            annotations["runbook_url"] = _url(value, where)
        elif key in rule.thresholds:
            thresholds[key] = _threshold(key, value, where)
        else:
            allowed = ", ".join([*_RULE_KEYS, *rule.thresholds])
            raise ConfigError(f"unknown key (expected one of: {allowed})", key=where)
    return replace(rule, thresholds=thresholds, annotations=annotations, **changes)


def _duration(value: Any, where: str) -> float:
    try:
        return parse_duration(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc), key=where) from None


def _threshold(key: str, value: Any, where: str) -> Threshold:
    if key == "codes":
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ConfigError("expected a list of integers (XID codes)", key=where)
        return tuple(float(v) for v in value)
    if key.endswith("_s") or key == "ras_mismatch_for":  # the name for a duration, kept as given
        return _duration(value, where)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ConfigError(f"expected a non-negative number, got {value!r:.40}", key=where)
    return float(value)


def _annotations(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ConfigError('expected a table of strings, e.g. { team_channel = "#gpu-oncall" }', key=where)
    for name in value:
        if name in _COMPUTED_ANNOTATIONS:
            raise ConfigError(f"{name}: written by the rule for each alert", key=where)
        if not name.isidentifier():
            raise ConfigError(f"{name!r:.40}: expected a name of letters, digits and _", key=where)
    if "runbook_url" in value:
        _url(value["runbook_url"], where)
    return dict(value)


def _url(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.startswith(("https://", "http://")) or any(c.isspace() for c in value):
        raise ConfigError(f"expected an http:// or https:// URL, got {value!r:.60}", key=where)
    return value


def _labels(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ConfigError('expected a table of strings, e.g. { team = "infra" }', key=where)
    if "alertname" in value or "severity" in value:
        raise ConfigError("alertname and severity are set by the rule", key=where)
    return dict(value)
