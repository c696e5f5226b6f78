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

import msgspec

from gpulens.alerts.base import SCOPES, SEVERITIES, AlertRule, Candidate, gpu_subject, rule_labels
from gpulens.alerts.history import History, nvlink_bytes_per_second
from gpulens.config import TomlLocator
from gpulens.model import GpuReading
from gpulens.ratios import memory_used_ratio_of, power_limit_ratio_of
from gpulens.typedinput import Duration, FieldError, InputStruct, convert, input_error

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


def _pcie(r: GpuReading) -> float | None:
    values = [v for v in (r.pcie_tx_bytes_per_second, r.pcie_rx_bytes_per_second) if v is not None]
    return sum(values) if values else None


DERIVED_FIELDS: Final[Mapping[str, Callable[[GpuReading], float | None]]] = {
    "memory_used_ratio": memory_used_ratio_of,
    "power_limit_ratio": power_limit_ratio_of,
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


def _choice(key: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        shown = ", ".join(choices) if len(choices) <= 8 else ", ".join(choices[:8]) + ", ... (see docs/alerts.md)"
        raise FieldError(key, f"unknown {key} {value!r} (expected one of: {shown})")


class RuleFile(InputStruct, frozen=True, kw_only=True):
    """One ``[[alerts.rules]]`` table as written; :meth:`rule` turns it into an :class:`AlertRule`."""

    name: str
    field: str
    op: str = ">"
    threshold: float
    scope: str = "gpu"
    aggregate: str = "max"
    for_: Duration = msgspec.field(default=Duration(0.0), name="for")
    keep_firing_for: Duration = Duration(0.0)
    severity: str = "warning"
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    summary: str = ""
    description: str = ""
    annotations: dict[str, str] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _RULE_NAME.match(self.name):
            raise FieldError("name", f"{self.name!r} is not a rule name (letters, digits, _; a letter first)")
        _choice("field", self.field, FIELDS)
        _choice("scope", self.scope, SCOPES)
        _choice("op", self.op, tuple(OPERATORS))
        _choice("aggregate", self.aggregate, tuple(AGGREGATES))
        _choice("severity", self.severity, SEVERITIES)
        for key in self.labels:
            if not _LABEL_NAME.match(key) or key in ("alertname", "severity"):
                raise FieldError("labels", f"{key!r} cannot be a label name here")
        self._check_template("summary", self.summary)
        self._check_template("description", self.description)
        for key, template in self.annotations.items():
            if key in ("summary", "description", "dashboard"):
                raise FieldError("annotations", f"set {key!r} with its own key, not in annotations")
            self._check_template("annotations", template)

    def _check_template(self, key: str, template: str) -> None:
        """Only plain names the rule can fill; no attribute or index access (``{value.__class__}``)."""
        known = set(_TEMPLATE_FIELDS) | set(self.labels)
        try:
            parts = list(string.Formatter().parse(template))
        except ValueError as exc:
            raise FieldError(key, f"bad template: {exc}") from None
        for _, name, spec, _ in parts:
            if name is None:
                continue
            if name not in known:
                raise FieldError(key, f"unknown template field {{{name}}} (use: {', '.join(sorted(known))})")
            sample: Any = 1.5 if name in ("value", "threshold") else "x"
            try:
                format(sample, spec or "")
            except ValueError as exc:
                raise FieldError(key, f"bad format for {{{name}}}: {exc}") from None

    def rule(self) -> AlertRule:
        condition = Condition(
            field=self.field,
            op=self.op,
            threshold=float(self.threshold),
            aggregate=self.aggregate,
            summary=self.summary,
            description=self.description,
        )
        per = f"{condition.aggregate} of " if self.scope != "gpu" else ""
        return AlertRule(
            name=self.name,
            severity=self.severity,
            for_s=float(self.for_),
            keep_firing_for_s=float(self.keep_firing_for),
            labels=dict(self.labels),
            annotations=dict(self.annotations),
            scope=self.scope,
            check=THRESHOLD_CHECK,
            condition=condition,
            meaning=f"User rule: {per}{self.field} {condition.op} {condition.threshold:g} per {self.scope}.",
        )


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
    text = locator.text if locator is not None else ""
    at = table.split(".")
    files = convert(items, tuple[RuleFile, ...], text=text, source=source, at=at)
    return build_user_rules(files, at=at, text=text, source=source, reserved=reserved)


def build_user_rules(
    files: Sequence[RuleFile], *, at: Sequence[str], text: str, source: str | None, reserved: Sequence[str] = ()
) -> list[AlertRule]:
    """Rules from converted tables at ``at`` in the file ``text``; names must be unique and not ``reserved``."""
    rules: list[AlertRule] = []
    for index, item in enumerate(files):
        rule = item.rule()
        problem = None
        if rule.name in reserved:
            problem = f"{rule.name!r} is a builtin rule; override it in [alerts.builtin.{rule.name}]"
        elif any(r.name == rule.name for r in rules):
            problem = f"rule {rule.name!r} is defined twice"
        if problem:
            raise input_error(problem, [*at, index, "name"], text=text, source=source)
        rules.append(rule)
    return rules
