"""The types every rule shares: a rule (``AlertRule``), a condition that holds now (``Candidate``), and label helpers.

Labels follow one convention on every alert: ``alertname`` and ``severity``, then as they apply ``node``, ``gpu``
(the index on its node), ``uuid``, ``job_id`` and ``user``. A rule's own static labels come after and never replace
those.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import quote

from gpulens.model import THROTTLE_INFERRED, THROTTLE_VIOLATION, GpuJob, GpuReading

SEVERITIES: Final = ("critical", "warning", "info")
SCOPES: Final = ("gpu", "node", "job")

# Labels an alert's identity is made of, in display order.
IDENTITY_LABELS: Final = ("alertname", "severity", "node", "gpu", "uuid", "job_id", "user")

Threshold = float | tuple[float, ...]


@dataclass(frozen=True)
class AlertRule:
    """One alert rule: a builtin of the catalogue or a user rule from the config.

    ``check`` names the detector that evaluates it (a builtin's own name, or ``"threshold"`` for user rules);
    ``thresholds`` are its tunable numbers; ``condition`` is a user rule's threshold expression.
    """

    name: str
    severity: str
    for_s: float
    keep_firing_for_s: float = 0.0
    thresholds: Mapping[str, Threshold] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    scope: str = "gpu"  # "gpu" | "node" | "job": what one alert of the rule is about
    check: str = ""
    condition: object | None = None  # a user rule's ``userrules.Condition``
    meaning: str = ""
    action: str = ""

    def threshold(self, name: str) -> float:
        value = self.thresholds[name]
        if isinstance(value, tuple):
            raise TypeError(f"{self.name}.{name} is a list, not a number")
        return float(value)

    def codes(self, name: str) -> frozenset[int]:
        value = self.thresholds[name]
        items = value if isinstance(value, tuple) else (value,)
        return frozenset(int(v) for v in items)


@dataclass(frozen=True)
class Candidate:
    """A rule's condition holding now for one subject (a GPU, a node or a job).

    ``hold`` marks a subject whose condition cannot be judged this round (a job pausing for its data loader while a
    straggler is pending): any alert of ``rule`` whose labels include ``labels`` keeps its state unchanged, and no
    new alert starts.
    """

    rule: str
    labels: Mapping[str, str]
    value: float | None
    summary: str
    description: str
    hold: bool = False
    annotations: Mapping[str, str] = field(default_factory=dict)  # extra annotations (a user rule's templates)
    for_s: float | None = None  # how long it must hold before it fires, when not the rule's ``for``
    began: float | None = None  # when the fault began, where the detector knows it was before this round


def rule_labels(rule: AlertRule, subject: Mapping[str, str]) -> dict[str, str]:
    """The full label set of one alert of ``rule`` about ``subject`` (node, gpu, uuid, job_id, user, ...)."""
    labels = {"alertname": rule.name, "severity": rule.severity}
    for key in IDENTITY_LABELS[2:]:
        value = subject.get(key)
        if value:
            labels[key] = value
    for key, value in subject.items():
        if key not in labels and value:
            labels[key] = value
    for key, value in rule.labels.items():
        labels.setdefault(key, value)
    return labels


def gpu_subject(reading: GpuReading, jobs: Sequence[GpuJob] = ()) -> dict[str, str]:
    """Labels that place a GPU: its node, index and UUID, and the job(s) and user(s) holding it."""
    subject = {"node": reading.node, "gpu": str(reading.gpu), "uuid": reading.uuid}
    job_ids = sorted({j.job_id for j in jobs})
    users = sorted({j.user for j in jobs if j.user})
    if job_ids:
        subject["job_id"] = ",".join(job_ids)
    if users:
        subject["user"] = ",".join(users)
    return subject


def gpu_name(labels: Mapping[str, str]) -> str:
    """``node-01:3``: how a person names a GPU."""
    return f"{labels.get('node', '?')}:{labels.get('gpu', '?')}"


def job_suffix(labels: Mapping[str, str]) -> str:
    """`` (job llm-pretrain, user alice)`` for a GPU held by a job, else an empty string."""
    parts = []
    if labels.get("job_id"):
        parts.append(f"job {labels['job_id']}")
    if labels.get("user"):
        parts.append(f"user {labels['user']}")
    return f" ({', '.join(parts)})" if parts else ""


def dashboard_path(labels: Mapping[str, str], scope: str = "gpu") -> str | None:
    """The dashboard page an alert is about: ``/jobs/<job_id>``, ``/gpus/<uuid>`` or ``/nodes/<node>``."""
    job = labels.get("job_id")
    uuid = labels.get("uuid")
    node = labels.get("node")
    order = {"job": (("jobs", job), ("gpus", uuid), ("nodes", node))}.get(
        scope, (("gpus", uuid), ("nodes", node), ("jobs", job))
    )
    for page, ident in order:
        if ident and "," not in ident:
            return f"/{page}/{quote(ident, safe='')}"
    return None


def dashboard_link(dashboard_url: str | None, labels: Mapping[str, str], scope: str = "gpu") -> str | None:
    """The dashboard page as a full link when ``dashboard_url`` is known, else as a path."""
    path = dashboard_path(labels, scope)
    if path is None:
        return None
    return (dashboard_url or "").rstrip("/") + path


def percent(ratio: float) -> str:
    return f"{ratio * 100:.0f}%"


def rate_text(bytes_per_second: float) -> str:
    """``12.3 GB/s``: a throughput the way people read it (decimal units, like link datasheets)."""
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_per_second >= size:
            return f"{bytes_per_second / size:.1f} {unit}"
    return f"{bytes_per_second:.0f} B/s"


def reasons_source_text(reading: GpuReading) -> str:
    """What follows a reading's throttle reasons in an alert when the driver did not report them: inferred from clock,
    temperature and power, or taken from DCGM's violation counters (``gpulens.dcgmthrottle``); empty when reported."""
    if reading.throttle_reasons_source == THROTTLE_INFERRED:
        return ", inferred from SM clock, temperature and power"
    if reading.throttle_reasons_source == THROTTLE_VIOLATION:
        return ", from DCGM's violation counters"
    return ""
