"""User rules from the config: a threshold on any numeric reading field, per GPU, node or job.

```toml
[[alerts.rules]]
name = "GpuHot"
field = "temperature_celsius"      # any numeric GpuReading field, or a derived one (DERIVED_FIELDS)
op = ">="                          # > >= < <= == !=
threshold = 85
scope = "gpu"                      # gpu | node | job
aggregate = "max"                  # node and job scope: max | min | avg | sum
for = "5m"
keep_firing_for = "1m"
severity = "warning"
labels = { team = "infra" }
summary = "GPU {node}:{gpu} at {value:.0f} °C"
description = "{field} {op} {threshold} on {uuid}"
```

Templates use ``str.format`` fields: ``node``, ``gpu``, ``uuid``, ``job_id``, ``user``, ``value``, ``threshold``,
``field``, ``op``, ``rule`` and the rule's labels; a name the template cannot fill is an error when the config loads.
"""

from __future__ import annotations

import dataclasses
import operator
import re
import string
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gpulens.config import ConfigError, TomlLocator, parse_duration
from gpulens.model import GpuReading

from .base import SCOPES, SEVERITIES, AlertRule, Candidate, gpu_subject, rule_labels
from .history import History, nvlink_bytes_per_second

THRESHOLD_CHECK: Final = "threshold"
OPERATORS: Final[Mapping[str, Callable[[float, float], bool]]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}
AGGREGATES: Final[Mapping[str, Callable[[list[float]], float]]] = {
    "max": max,
    "min": min,
    "avg": lambda values: sum(values) / len(values),
    "sum": sum,
}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _pcie(r: GpuReading) -> float | None:
    values = [v for v in (r.pcie_tx_bytes_per_second, r.pcie_rx_bytes_per_second) if v is not None]
    return sum(values) if values else None


DERIVED_FIELDS: Final[Mapping[str, Callable[[GpuReading], float | None]]] = {
    "memory_used_ratio": lambda r: _ratio(r.memory_used_bytes, r.memory_total_bytes),
    "power_limit_ratio": lambda r: _ratio(r.power_watts, r.power_limit_watts),
    "pcie_bytes_per_second": _pcie,
    "nvlink_bytes_per_second": nvlink_bytes_per_second,
    "temperature_margin_celsius": lambda r: (
        r.slowdown_temperature_celsius - r.temperature_celsius
        if r.slowdown_temperature_celsius is not None and r.temperature_celsius is not None
        else None
    ),
}
_NUMERIC: Final = ("int | None", "float | None", "bool | None")
READING_FIELDS: Final = tuple(f.name for f in dataclasses.fields(GpuReading) if str(f.type) in _NUMERIC)
FIELDS: Final = (*READING_FIELDS, *DERIVED_FIELDS)

_RULE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_KEYS: Final = frozenset(
    {
        "name",
        "field",
        "op",
        "threshold",
        "scope",
        "aggregate",
        "for",
        "keep_firing_for",
        "severity",
        "labels",
        "summary",
        "description",
        "annotations",
    }
)
_TEMPLATE_FIELDS: Final = ("node", "gpu", "uuid", "job_id", "user", "value", "threshold", "field", "op", "rule")


@dataclass(frozen=True)
class Condition:
    """A user rule's test: ``aggregate(field) op threshold`` over the rule's scope."""

    field: str
    op: str
    threshold: float
    aggregate: str = "max"
    summary: str = ""
    description: str = ""

    def value(self, reading: GpuReading) -> float | None:
        derived = DERIVED_FIELDS.get(self.field)
        raw = derived(reading) if derived is not None else getattr(reading, self.field)
        return None if raw is None else float(raw)

    def holds(self, value: float) -> bool:
        return OPERATORS[self.op](value, self.threshold)


# ------------------------------------------------------------------------------------------------ evaluation


def _groups(rule: AlertRule, history: History) -> Iterator[tuple[dict[str, str], list[GpuReading]]]:
    """The subjects of the rule's scope, each with its labels and its GPUs' readings in the latest round."""
    latest = history.latest
    if latest is None:
        return
    up = {uuid: r for uuid, r in latest.gpus.items() if r.up}
    if rule.scope == "gpu":
        for uuid, reading in up.items():
            yield gpu_subject(reading, latest.gpu_jobs.get(uuid, ())), [reading]
    elif rule.scope == "node":
        nodes: dict[str, list[GpuReading]] = {}
        for reading in up.values():
            nodes.setdefault(reading.node, []).append(reading)
        for node, readings in nodes.items():
            yield {"node": node}, readings
    else:
        for job_id, view in latest.jobs.items():
            readings = [up[uuid] for uuid in view.gpus if uuid in up]
            if readings:
                yield {"job_id": job_id, "user": view.user or ""}, readings


def threshold_check(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    """Evaluate a user rule on the latest round."""
    condition = rule.condition
    assert isinstance(condition, Condition)
    out = []
    for subject, readings in _groups(rule, history):
        values = [v for r in readings if (v := condition.value(r)) is not None]
        if not values:
            continue
        value = AGGREGATES[condition.aggregate](values)
        if not condition.holds(value):
            continue
        labels = rule_labels(rule, subject)
        context = _template_context(rule, condition, labels, value)
        summary = condition.summary.format_map(context) if condition.summary else _default_summary(rule, context)
        description = condition.description.format_map(context) if condition.description else ""
        annotations = {key: template.format_map(context) for key, template in rule.annotations.items()}
        out.append(Candidate(rule.name, labels, value, summary, description, annotations=annotations))
    return out


class _Context(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        return ""


def _template_context(rule: AlertRule, condition: Condition, labels: Mapping[str, str], value: float) -> _Context:
    context = _Context(labels)
    context.update({"value": value, "threshold": condition.threshold, "field": condition.field, "op": condition.op})
    context["rule"] = rule.name
    return context


def _default_summary(rule: AlertRule, context: Mapping[str, Any]) -> str:
    where = {
        "gpu": f"GPU {context.get('node')}:{context.get('gpu')}",
        "node": f"node {context.get('node')}",
        "job": f"job {context.get('job_id')}",
    }[rule.scope]
    return f"{where}: {context['field']} = {context['value']:g} ({context['op']} {context['threshold']:g})"


# ------------------------------------------------------------------------------------------------ parsing


def parse_user_rules(
    items: Any,
    *,
    source: str | None = None,
    locator: TomlLocator | None = None,
    table: str = "alerts.rules",
    reserved: Sequence[str] = (),
) -> list[AlertRule]:
    """Validate ``[[alerts.rules]]`` tables into rules. Raises ``ConfigError`` naming the file, key and line.

    ``reserved`` are names user rules may not take (the builtin catalogue's).
    """
    if not isinstance(items, list):
        raise ConfigError(f"use [[{table}]] tables", file=source, key=table)
    rules: list[AlertRule] = []
    for index, item in enumerate(items):
        parser = _RuleParser(item, index, source, locator, table)
        rule = parser.parse()
        if rule.name in reserved:
            raise parser.fail("name", f"{rule.name!r} is a builtin rule; override it in [alerts.builtin.{rule.name}]")
        if any(r.name == rule.name for r in rules):
            raise parser.fail("name", f"rule {rule.name!r} is defined twice")
        rules.append(rule)
    return rules


class _RuleParser:
    def __init__(self, data: Any, index: int, source: str | None, locator: TomlLocator | None, table: str) -> None:
        self.data = data
        self.index = index
        self.source = source
        self.locator = locator
        self.table = table

    def fail(self, key: str | None, message: str) -> ConfigError:
        line = self.locator.line_of(self.table, self.index, key) if self.locator else None
        where = f"{self.table}[{self.index}]" + (f".{key}" if key else "")
        return ConfigError(message, file=self.source, key=where, line=line)

    def parse(self) -> AlertRule:
        if not isinstance(self.data, dict):
            raise self.fail(None, f"expected a table ([[{self.table}]])")
        for key in self.data:
            if key not in _KEYS:
                raise self.fail(key, f"unknown key (expected one of: {', '.join(sorted(_KEYS))})")
        name = self._text("name")
        if not _RULE_NAME.match(name):
            raise self.fail("name", f"{name!r} is not a rule name (letters, digits, _; a letter first)")
        field = self._choice("field", FIELDS, None)
        scope = self._choice("scope", SCOPES, "gpu")
        condition = Condition(
            field=field,
            op=self._choice("op", tuple(OPERATORS), ">"),
            threshold=self._number("threshold"),
            aggregate=self._choice("aggregate", tuple(AGGREGATES), "max"),
            summary=self._template("summary"),
            description=self._template("description"),
        )
        labels = self._labels()
        annotations = self._annotations()
        return AlertRule(
            name=name,
            severity=self._choice("severity", SEVERITIES, "warning"),
            for_s=self._duration("for"),
            keep_firing_for_s=self._duration("keep_firing_for"),
            labels=labels,
            annotations=annotations,
            scope=scope,
            check=THRESHOLD_CHECK,
            condition=condition,
            meaning=f"User rule: {condition.aggregate + ' of ' if scope != 'gpu' else ''}{field} {condition.op} "
            f"{condition.threshold:g} per {scope}.",
        )

    def _text(self, key: str, default: str | None = None) -> str:
        value = self.data.get(key, default)
        if value is None:
            raise self.fail(key, "missing required key")
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, f"expected a non-empty string, got {value!r:.40}")
        return value.strip()

    def _choice(self, key: str, choices: Sequence[str], default: str | None) -> str:
        value = self._text(key, default)
        if value not in choices:
            shown = ", ".join(choices) if len(choices) <= 8 else ", ".join(choices[:8]) + ", ... (see docs/alerts.md)"
            raise self.fail(key, f"unknown {key} {value!r} (expected one of: {shown})")
        return value

    def _number(self, key: str) -> float:
        value = self.data.get(key)
        if value is None:
            raise self.fail(key, "missing required key")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(key, f"expected a number, got {value!r:.40}")
        return float(value)

    def _duration(self, key: str) -> float:
        value = self.data.get(key, 0)
        try:
            return parse_duration(value)
        except (TypeError, ValueError) as exc:
            raise self.fail(key, str(exc)) from None

    def _labels(self) -> dict[str, str]:
        value = self.data.get("labels", {})
        if not isinstance(value, dict):
            raise self.fail("labels", 'expected a table of strings, e.g. { team = "infra" }')
        for key, item in value.items():
            if not _LABEL_NAME.match(key) or key in ("alertname", "severity"):
                raise self.fail("labels", f"{key!r} cannot be a label name here")
            if not isinstance(item, str):
                raise self.fail("labels", f"label {key!r} must be a string, got {item!r:.40}")
        return dict(value)

    def _annotations(self) -> dict[str, str]:
        value = self.data.get("annotations", {})
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise self.fail("annotations", "expected a table of strings")
        for key in value:
            if key in ("summary", "description", "dashboard"):
                raise self.fail("annotations", f"set {key!r} with its own key, not in annotations")
            self._check_template("annotations", value[key])
        return dict(value)

    def _template(self, key: str) -> str:
        value = self.data.get(key, "")
        if not isinstance(value, str):
            raise self.fail(key, f"expected a string, got {value!r:.40}")
        self._check_template(key, value)
        return value

    def _check_template(self, key: str, template: str) -> None:
        """Only plain names the rule can fill; no attribute or index access (``{value.__class__}``)."""
        labels = self.data.get("labels", {})
        known = set(_TEMPLATE_FIELDS) | (set(labels) if isinstance(labels, dict) else set())
        try:
            parts = list(string.Formatter().parse(template))
        except ValueError as exc:
            raise self.fail(key, f"bad template: {exc}") from None
        for _, name, spec, _ in parts:
            if name is None:
                continue
            if name not in known:
                raise self.fail(key, f"unknown template field {{{name}}} (use: {', '.join(sorted(known))})")
            sample: Any = 1.5 if name in ("value", "threshold") else "x"
            try:
                format(sample, spec or "")
            except ValueError as exc:
                raise self.fail(key, f"bad format for {{{name}}}: {exc}") from None
